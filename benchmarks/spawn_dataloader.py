# What a Windows (or macOS) user writes and runs, as is: no `if __name__ == "__main__":` guard, a lambda
# as collate_fn, and DataLoader worker processes under the `spawn` start method (the only one Windows
# has). It fails: spawn re-imports this script in every worker and must pickle the lambda.
import multiprocessing

import torch
from torch.utils.data import DataLoader

multiprocessing.set_start_method("spawn", force=True)

data = [torch.full((4,), float(i)) for i in range(64)]
loader = DataLoader(data, batch_size=8, num_workers=2, collate_fn=lambda batch: torch.stack(batch))
print("sum", int(sum(batch.sum() for batch in loader)))
