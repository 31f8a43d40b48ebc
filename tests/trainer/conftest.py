"""The trainer's tests train in this process; torch is imported here, not for the whole suite (the
service's tests and `make test-fast` never pay its import)."""

import torch

# Same thread count in every process: CPU kernels then give the same bits, run after run.
torch.set_num_threads(1)
