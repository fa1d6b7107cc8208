"""One small script per implementation, all speaking the protocol of :mod:`bench.candidates._runner`.

Run as ``python -m bench.candidates.<impl> --name NAME --url URL [...]``.
"""
