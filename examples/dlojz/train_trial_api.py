"""train.py with the trial API (``from hpo import trial``): parameters, a checkpoint folder that
survives requeues, reports that can stop the run, and DDP over as many ranks as it is launched
with (srun -n 2, torchrun, or a trial job with resources.tasks_per_node: 2).

    python train_trial_api.py                   # alone: its defaults, checkpoints in ./checkpoints
    hpo launch examples/dlojz/study_trial_api.yaml

Under DDP every rank calls trial.report: rank 0's report reaches the study, and the answer is the
same on every rank, so all of them stop at the same epoch.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from train import Net, load  # the plain script next to this one

from hpo import trial

DEFAULTS = {"lr": 0.05, "wd": 5e-4, "batch_size": 64, "epochs": 4, "width": 16, "train_samples": 4096}


def main() -> None:
    params = trial.params(DEFAULTS)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:  # RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the launcher
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world_size > 1 else 0
    torch.manual_seed(0)
    torch.set_num_threads(1)
    root = os.environ.get("DATA_ROOT", "/usr/share/datasets/fashion-mnist")
    train_set = load(Path(root), "train", int(params["train_samples"]))
    val_set = load(Path(root), "val", 2048)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=0)
    batch_size = int(params["batch_size"]) // world_size  # the global batch stays batch_size
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    model: torch.nn.Module = Net(int(params["width"]))
    if world_size > 1:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=0.9, weight_decay=params["wd"])
    epochs = int(params["epochs"])
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=params["lr"], epochs=epochs, steps_per_epoch=len(train_loader)
    )

    # The same folder across requeues and retries of the trial: resume where the last run stopped.
    checkpoint = trial.checkpoint_dir("checkpoints") / "last.pt"
    start_epoch = 0
    if checkpoint.exists():
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch = state["epoch"]
        print(f"rank {rank}: resumed from epoch {start_epoch}", flush=True)

    for epoch in range(start_epoch + 1, epochs + 1):
        began = time.perf_counter()
        sampler.set_epoch(epoch)
        model.train()
        for images, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
            scheduler.step()
        model.eval()
        with torch.no_grad():  # every rank scores half of the validation images
            shard = val_set.tensors[0][rank::world_size], val_set.tensors[1][rank::world_size]
            counts = torch.tensor([(model(shard[0]).argmax(1) == shard[1]).sum().item(), len(shard[1])])
        if world_size > 1:
            dist.all_reduce(counts)
        accuracy = counts[0].item() / counts[1].item()
        if not math.isfinite(accuracy):
            raise SystemExit(f"no validation accuracy at epoch {epoch}")
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "epoch": epoch}, checkpoint.with_suffix(".tmp"))  # fmt: skip
            os.replace(checkpoint.with_suffix(".tmp"), checkpoint)
        print(f"rank {rank}: epoch {epoch}/{epochs} val_acc {accuracy:.4f} "
              f"time {time.perf_counter() - began:.1f}s", flush=True)  # fmt: skip
        if trial.report(epoch, accuracy):  # True on every rank when the study prunes this trial
            print(f"rank {rank}: stopped by the study after epoch {epoch}", flush=True)
            break
    if world_size > 1:
        dist.barrier()  # no rank tears the group down while another still uses it
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
