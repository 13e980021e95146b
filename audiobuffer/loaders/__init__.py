"""What a training loop iterates: ``BufferedDataset``, ``BatchSlotLoader``, the device path and
``IsolatedLoader``, each composing the epoch engine with its options."""
