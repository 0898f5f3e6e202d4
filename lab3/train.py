"""Train lab 3's two networks with torch and write their weights and the test set as safetensors.

    python -m lab3.train [--arch mlp|cnn|all] [--data auto|mnist|offline] [--epochs N]   (make train-lab3)

MLP: x (B, 1, 28, 28) -> flatten (B, 784) -> fc1 (B, 1000) -> ReLU -> fc2 (B, 10) logits.
CNN: x (B, 1, 28, 28) -> conv1 5x5 pad 2 (B, 16, 28, 28) -> ReLU -> maxpool 2 (B, 16, 14, 14)
     -> conv2 5x5 pad 2 (B, 32, 14, 14) -> ReLU -> maxpool 2 (B, 32, 7, 7) -> flatten (B, 1568)
     -> the MLP head: fc1 (B, 1000) -> ReLU -> fc2 (B, 10).
Adam, cross-entropy, seeded; CPU or GPU, whichever is there. Each run asserts its data set's threshold.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from lab3 import mnist, network

# (data kind, arch) -> test accuracy the trained network must reach. MNIST's are the course's promise; the
# offline ones sit 1.7 points below the worst of seeds 0-4 (96.67% for both; chapter, "The network and its data").
THRESHOLDS = {
    ("mnist", "mlp"): 0.97,
    ("mnist", "cnn"): 0.985,
    ("offline", "mlp"): 0.95,
    ("offline", "cnn"): 0.95,
}
# (data kind, arch) -> epochs: MNIST has 60000 images per epoch, the offline set 1437
EPOCHS = {("mnist", "mlp"): 3, ("mnist", "cnn"): 3, ("offline", "mlp"): 20, ("offline", "cnn"): 12}
BATCH, LR, SEED = 64, 1e-3, 0


class MLP(nn.Module):
    """784 -> 1000 -> ReLU -> 10; the weights are nn.Linear's (out, in)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(network.PIXELS, network.HIDDEN)
        self.fc2 = nn.Linear(network.HIDDEN, network.CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))  # (B, 1, 28, 28) -> (B, 784) -> (B, 1000) -> (B, 10)


class CNN(nn.Module):
    """Two conv 5x5 + ReLU + maxpool 2 stages, then the MLP's head on the (B, 32 * 7 * 7) features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, network.CONV1, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(network.CONV1, network.CONV2, kernel_size=5, padding=2)
        self.fc1 = nn.Linear(network.FEATURES, network.HIDDEN)
        self.fc2 = nn.Linear(network.HIDDEN, network.CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)  # (B, 1, 28, 28) -> (B, 16, 14, 14)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)  # -> (B, 32, 7, 7)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))  # (B, 1568) -> (B, 1000) -> (B, 10)


ARCHS: dict[str, type[nn.Module]] = {"mlp": MLP, "cnn": CNN}


@dataclass
class Trained:
    arch: str
    model: nn.Module
    accuracy: float  # over exactly the test set's N images
    losses: list[float]  # mean training loss per epoch
    seconds: float


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@torch.no_grad()
def predict_logits(model: nn.Module, x: torch.Tensor, batch: int = 1024) -> torch.Tensor:
    """Logits (N, 10) for all N images; the last batch is just shorter, never padded."""
    model.eval()
    dev = next(model.parameters()).device
    return torch.cat([model(x[i : i + batch].to(dev)).float().cpu() for i in range(0, len(x), batch)])


def train(
    arch: str,
    data: mnist.Digits,
    epochs: int | None = None,
    seed: int = SEED,
    log: Callable[[str], None] | None = None,
) -> Trained:
    """Train one network from a fixed seed on data's training images; accuracy on its test images."""
    start = time.perf_counter()
    epochs = EPOCHS[(data.kind, arch)] if epochs is None else epochs
    torch.manual_seed(seed)
    dev = device()
    model = ARCHS[arch]().to(dev)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    x, y = torch.from_numpy(data.train_x), torch.from_numpy(data.train_y)
    order = torch.Generator().manual_seed(seed)
    losses = []
    for epoch in range(epochs):
        model.train()
        total, seen = 0.0, 0
        for idx in torch.randperm(len(y), generator=order).split(BATCH):
            xb, yb = x[idx].to(dev), y[idx].to(dev)
            loss = nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
            seen += len(idx)
        losses.append(total / seen)
        if log:
            log(f"  {arch} epoch {epoch + 1}/{epochs}: loss {losses[-1]:.4f}")
    logits = predict_logits(model, torch.from_numpy(data.test_x))
    acc = network.accuracy(logits, torch.from_numpy(data.test_y))
    return Trained(arch, model.cpu(), acc, losses, time.perf_counter() - start)


def save(result: Trained, data: mnist.Digits, models_dir: network.PathLike | None = None) -> None:
    state = {k: v.detach().float().contiguous() for k, v in result.model.state_dict().items()}
    meta = {"arch": result.arch, "dataset": data.name, "data": data.kind, "accuracy": f"{result.accuracy:.6f}"}
    network.write_safetensors(network.weights_path(result.arch, models_dir), state, meta)


def save_testset(data: mnist.Digits, models_dir: network.PathLike | None = None) -> None:
    tensors = {"x": torch.from_numpy(data.test_x).contiguous(), "y": torch.from_numpy(data.test_y).contiguous()}
    meta = {"arch": "testset", "dataset": data.name, "data": data.kind}
    network.write_safetensors(network.weights_path("testset", models_dir), tensors, meta)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab3.train", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=["mlp", "cnn", "all"], default="all")
    parser.add_argument("--data", choices=["auto", "mnist", "offline"], default="auto")
    parser.add_argument("--epochs", type=int, default=None, help="default: per network and data set")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--models-dir", default=None, help="default: lab3/models (or LAB3_MODELS_DIR)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    data = mnist.load(args.data)
    print(data.source)
    print(f"training on {device()}")
    save_testset(data, args.models_dir)
    failed = []
    for arch in ["mlp", "cnn"] if args.arch == "all" else [args.arch]:
        result = train(arch, data, args.epochs, args.seed, log=print)
        need = THRESHOLDS[(data.kind, arch)]
        verdict = "ok" if result.accuracy >= need else "BELOW THE THRESHOLD"
        print(
            f"{arch}: test accuracy {result.accuracy:.2%} on {len(data.test_y)} images"
            f" (threshold {need:.1%} on {data.name}): {verdict}; {result.seconds:.1f} s"
        )
        save(result, data, args.models_dir)
        if result.accuracy < need:
            failed.append(arch)
    print(f"wrote {network.models_dir(args.models_dir)}; total {time.perf_counter() - start:.1f} s")
    if failed:
        print(f"error: {', '.join(failed)} below the stated accuracy", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
