"""Throwaway servers on 127.0.0.1, one module per kind: MariaDB, etcd, PostgreSQL."""
