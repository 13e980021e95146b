"""``IsolatedLoader``: the producers and the collate in one helper process, batches through shared
memory. The helper imports this package without torch."""
