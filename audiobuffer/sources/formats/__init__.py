"""What other tools write, read as it is: Lhotse manifests (:mod:`.lhotse`) and Hugging Face audio datasets in
Parquet (:mod:`.parquet`). WebDataset shards are the shards of :mod:`audiobuffer.sources.tar`."""
