"""What is done to a dataset ahead of its epochs: each item's duration, read once and cached
(:mod:`~audiobuffer.prepare.durations`), and files packed into tar shards with an index
(:mod:`~audiobuffer.prepare.pack`, whose ``pack`` and ``index_shards`` :mod:`audiobuffer.sources`
names too). Both read files through :mod:`audiobuffer.sources` and the decoders.
"""
