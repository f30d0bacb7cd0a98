"""ferry.data.DataLoader against torch.utils.data.DataLoader: the same dataset through both,
alternated in rounds in one run, the same num_workers, batch size and seed.

Scenarios:
  dicts     batches of 64 samples, each a dict of 16 small tensors (token ids, masks, a few
            floats) that the dataset holds in memory, as a preprocessed dataset does
  images    batches of 64 uint8 [3, 224, 224] images the dataset makes (no decode)
  pipeline  a real pipeline on real data: the sample JPEGs that python3-sklearn ships,
            decoded with torchvision.io, random crops and flips, a small CNN trained with SGD
            for a fixed number of steps and a fixed seed; wall time per epoch, and the loss
            at every step through both loaders (they must be equal)
For dicts and images: batches per second (the trainer takes each batch and drops it) and the
trainer's CPU per batch (time.process_time over the measured batches: every thread of the
trainer process, waiting, receiving, rebuilding and dropping the batch), after a few
warm-up batches so that worker start-up is not counted.

Usage: PYTHONPATH=build/release/python /usr/bin/python3 bench/peers/dataloader_compare.py
       [--rounds R] [--workers N] [--batches B] [--only dicts,images,pipeline]
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

from ferry.data import DataLoader as FerryDataLoader

LOADERS = {"torch": TorchDataLoader, "ferry": FerryDataLoader}


class Dicts(Dataset):
    """Samples held in memory: 16 small tensors each."""

    def __init__(self, size=64 * 128):
        generator = torch.Generator().manual_seed(0)
        self.samples = []
        for index in range(size):
            sample = {"input_ids": torch.randint(0, 30000, (128,), generator=generator),
                      "attention_mask": torch.ones(128, dtype=torch.uint8),
                      "token_type_ids": torch.zeros(128, dtype=torch.int64),
                      "label": torch.tensor(index % 7)}
            for k in range(12):
                sample[f"feature_{k}"] = torch.rand(4, generator=generator)
            self.samples.append(sample)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


class Images(Dataset):
    """uint8 [3, 224, 224] images made on request (no decode), and a label."""

    def __len__(self):
        return 64 * 1024

    def __getitem__(self, index):
        return torch.full((3, 224, 224), index % 251, dtype=torch.uint8), index % 10


def throughput(loader_class, dataset, batches, workers, warmup=5):
    """(batches per second, trainer CPU seconds per batch) over `batches` batches."""
    loader = loader_class(dataset, batch_size=64, shuffle=True, num_workers=workers,
                          generator=torch.Generator().manual_seed(0))
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        batch = next(iterator)
        del batch
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    del iterator
    return batches / wall, cpu / batches


# ---- the pipeline -------------------------------------------------------------------------

class Photos(Dataset):
    """The JPEGs python3-sklearn ships, decoded per sample, randomly cropped and flipped."""

    def __init__(self, size):
        import sklearn.datasets
        import torchvision.io
        folder = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images")
        self.files = [torchvision.io.read_file(os.path.join(folder, name))
                      for name in sorted(os.listdir(folder)) if name.endswith(".jpg")]
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        import torchvision.io
        import torchvision.transforms as T
        label = index % len(self.files)
        image = torchvision.io.decode_jpeg(self.files[label])
        image = T.RandomResizedCrop(160, scale=(0.3, 1.0), antialias=True)(image)
        image = T.RandomHorizontalFlip()(image)
        return image, label


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 5, stride=2)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2)
        self.head = nn.Linear(32, 2)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Training:
    """One fixed-seed training run fed by one kind of loader, an epoch at a time."""

    def __init__(self, loader_class, dataset, workers):
        torch.manual_seed(0)
        self.model = SmallNet()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.loader = loader_class(dataset, batch_size=32, shuffle=True, num_workers=workers,
                                   generator=torch.Generator().manual_seed(0), persistent_workers=True)
        self.losses = []

    def epoch(self):
        """Seconds this epoch took."""
        began = time.perf_counter()
        for images, labels in self.loader:
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(images.float() / 255.0), labels)
            loss.backward()
            self.optimizer.step()
            self.losses.append(loss.item())
        return time.perf_counter() - began


def pipeline(dataset, epochs, workers):
    """({loader: [seconds of each epoch after the first]}, {loader: losses}): both trainings
    side by side, their epochs alternated (torch, ferry, ferry, torch, ...), so that both see
    the machine in the same state; the first epoch (worker start-up) is not counted."""
    runs = {name: Training(kind, dataset, workers) for name, kind in LOADERS.items()}
    times = {name: [] for name in LOADERS}
    for epoch in range(epochs + 1):
        order = list(LOADERS) if epoch % 2 == 0 else list(reversed(LOADERS))
        for name in order:
            seconds = runs[name].epoch()
            if epoch > 0:
                times[name].append(seconds)
    losses = {name: run.losses for name, run in runs.items()}
    del runs
    return times, losses


# ---- the report ---------------------------------------------------------------------------

def alternate(rounds, run):
    """{loader name: [result per round]}, torch and ferry alternated (first one, then the other)."""
    results = {name: [] for name in LOADERS}
    for round_index in range(rounds):
        order = list(LOADERS) if round_index % 2 == 0 else list(reversed(LOADERS))
        for name in order:
            results[name].append(run(LOADERS[name]))
    return results


def report_throughput(title, results):
    rate = {name: statistics.median(r[0] for r in rows) for name, rows in results.items()}
    cpu = {name: statistics.median(r[1] for r in rows) for name, rows in results.items()}
    print(f"\n{title}")
    print(f"  {'loader':8} {'batches/s (median)':>20} {'trainer CPU us/batch (median)':>30}   per round")
    for name in LOADERS:
        rounds = ", ".join(f"{r[0]:.1f}/s {r[1] * 1e6:.0f}us" for r in results[name])
        print(f"  {name:8} {rate[name]:20.1f} {cpu[name] * 1e6:30.0f}   {rounds}")
    print(f"  ferry/torch: {rate['ferry'] / rate['torch']:.2f}x the batches per second, "
          f"{cpu['torch'] / cpu['ferry']:.1f}x less trainer CPU per batch")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=100, help="measured batches per run (dicts, images)")
    parser.add_argument("--epochs", type=int, default=6, help="measured pipeline epochs per loader")
    parser.add_argument("--photos", type=int, default=256, help="samples per pipeline epoch")
    parser.add_argument("--only", default="dicts,images,pipeline")
    options = parser.parse_args()
    scenarios = options.only.split(",")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, num_workers={options.workers}, "
          f"{options.rounds} rounds alternated")
    if "dicts" in scenarios:
        dataset = Dicts(64 * (options.batches + 10))
        report_throughput("1. batches of 64 dicts of 16 small tensors held in memory",
                          alternate(options.rounds, lambda kind: throughput(kind, dataset, options.batches,
                                                                             options.workers)))
    if "images" in scenarios:
        dataset = Images()
        report_throughput("2. batches of 64 uint8 [3, 224, 224] images made by the dataset",
                          alternate(options.rounds, lambda kind: throughput(kind, dataset, options.batches,
                                                                             options.workers)))
    if "pipeline" in scenarios:
        dataset = Photos(options.photos)
        times, losses = pipeline(dataset, options.epochs, options.workers)
        print(f"\n3. sklearn's sample JPEGs, decode + random crop/flip, a small CNN; "
              f"{options.epochs} epochs of {options.photos // 32} steps measured per loader, alternated")
        for name in LOADERS:
            print(f"  {name:8} seconds per epoch (median) {statistics.median(times[name]):.3f}   "
                  f"per epoch: {', '.join(f'{t:.3f}' for t in times[name])}")
        ratios = [f / t for f, t in zip(times["ferry"], times["torch"])]
        print(f"  ferry/torch epoch time: median of the per-epoch ratios {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f}-{max(ratios):.3f}); losses at every step identical: "
              f"{losses['ferry'] == losses['torch']} ({len(losses['ferry'])} steps; first "
              f"{', '.join(f'{v:.6f}' for v in losses['ferry'][:3])}; last {losses['ferry'][-1]:.6f})")

if __name__ == "__main__":
    main()
