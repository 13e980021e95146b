"""The epoch engine: producer threads (pool), their count (tuner), the pure plans of an epoch, and
one running epoch; every loader and the helper process run their epochs through it."""
