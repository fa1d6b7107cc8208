"""One module per backend, each behind the :class:`aioelect.Elector` contract."""
