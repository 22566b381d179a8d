"""A user's own convolutional ResNet on Fashion-MNIST, its residual layers layer-parallel.

    python examples/fashion_resnet.py                          # one process
    mpiexec -n 2 python -m mpi4py examples/fashion_resnet.py   # 16 layers on 2 ranks

(`-m mpi4py`: an exception or Ctrl-C on one rank ends every rank instead of leaving
the others waiting in their next message.)

Every rank runs this same script on the same batches; the residual layers are
split over the ranks and trained one-shot (two MGRIT iterations per solve,
warm-started from the last), the rest is ordinary PyTorch.
"""
import argparse

import torch
from torch import nn

from lptrain import LayerParallel, MGRITOptions
from lptrain.data.mnist import FashionMnistOptions, load_fashion_mnist
from lptrain.parallel.context import limit_threads, node_of, world

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--train", type=int, default=6000, help="training images")
p.add_argument("--layers", type=int, default=16)
args = p.parse_args()
comm = world()
limit_threads(node_of(comm))        # the node's cores shared by its ranks (as lptrain does)
say = print if comm.Get_rank() == 0 else (lambda *a: None)
torch.manual_seed(0)                # the same opening and classifier on every rank


def block(n: int) -> nn.Module:     # f_n, built only on the ranks that use layer n
    return nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.open = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU())
        self.body = LayerParallel(block, T=2.0, n_layers=args.layers, comm=comm,
                                  warm_start=True, mgrit=MGRITOptions(
                                      levels=2, cfactor0=4, tol=0.0, max_iter=2,
                                      adj_max_iter=2))
        self.head = nn.Sequential(nn.AvgPool2d(2), nn.Flatten(), nn.Linear(8 * 7 * 7, 10))

    def forward(self, x, **solve):
        return self.head(self.body(self.open(x), **solve))


data = load_fashion_mnist(FashionMnistOptions(n_train=args.train, n_val=1000), seed=0)
x, y = data.x_train.float(), data.y_train
net = Net()
opt = torch.optim.Adam(net.parameters(), lr=2e-3)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps)
order = torch.Generator().manual_seed(0)
for step in range(args.steps):
    idx = torch.randint(len(y), (100,), generator=order)
    loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if step % 50 == 0 or step == args.steps - 1:
        say(f"step {step:4d}  loss {loss.item():.4f}")
with torch.no_grad():               # evaluation with a converged forward solve
    hits = net(data.x_val.float(), max_iter=30, tol=1e-5).argmax(1) == data.y_val
say(f"validation accuracy {hits.double().mean().item():.4f}")
