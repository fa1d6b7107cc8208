"""The instance processes of ``python -m bench.shards``: one aioelect.Shards member, one tooz Partitioner member."""
