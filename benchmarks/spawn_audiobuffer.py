# The same script with audiobuffer: no guard, lambdas for decoder and collate, `spawn` as the start
# method. It runs: the producers are threads of this process, so nothing is re-imported or pickled.
import multiprocessing

import torch
from torch.utils.data import DataLoader

from audiobuffer import BufferedDataset

multiprocessing.set_start_method("spawn", force=True)

items = [f"item-{i}" for i in range(64)]
dataset = BufferedDataset(items, lambda item: torch.full((4,), float(item.index)), num_producers=2)
loader = DataLoader(dataset, batch_size=8, collate_fn=lambda batch: torch.stack(batch))
print("sum", int(sum(batch.sum() for batch in loader)))
