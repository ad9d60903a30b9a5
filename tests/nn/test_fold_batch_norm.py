"""fold_batch_norm: eval-mode batch norm folded into the convolution before it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_lattice as tl


def _scene(c: int, seed: int = 0) -> tl.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    coords = torch.unique(torch.randint(0, 10, (500, 4), generator=g), dim=0)
    coords[:, 0] %= 2
    coords = torch.unique(coords, dim=0)
    return tl.SparseTensor(torch.randn(coords.shape[0], c, generator=g), coords)


def _trained_stats(model: nn.Module, x: tl.SparseTensor) -> nn.Module:
    """Running statistics that are not the initial (0, 1), and affine parameters that
    are not (1, 0)."""
    torch.manual_seed(1)
    for m in model.modules():
        if isinstance(m, tl.nn.BatchNorm):
            with torch.no_grad():
                m.weight.uniform_(0.5, 2.0)
                m.bias.uniform_(-1.0, 1.0)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(x)
    return model.eval()


def test_unet_folds_every_batch_norm_and_computes_the_same() -> None:
    x = _scene(4)
    torch.manual_seed(0)
    net = _trained_stats(tl.backbones.SparseResUNet42(4, 5), x)
    folded = tl.nn.fold_batch_norm(net)
    assert not folded.training
    left = [m for m in folded.modules() if isinstance(m, tl.nn.BatchNorm)]
    assert left == []
    assert sum(isinstance(m, tl.nn.BatchNorm) for m in net.modules()) > 40  # unchanged
    with torch.no_grad():
        ref, got = net(x).feats, folded(x).feats
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))


@pytest.mark.parametrize(
    "conv",
    [
        lambda: tl.nn.SubmConv3d(3, 6, 3, bias=False),
        lambda: tl.nn.SubmConv3d(3, 6, 3),
        lambda: tl.nn.Conv3d(3, 6, 2, stride=2),
        lambda: tl.nn.Conv3d(3, 6, 1),
    ],
    ids=["subm-nobias", "subm-bias", "strided", "pointwise"],
)
def test_each_convolution_folds(conv) -> None:
    x = _scene(3, seed=2)
    torch.manual_seed(3)
    model = _trained_stats(nn.Sequential(conv(), tl.nn.BatchNorm(6), tl.nn.ReLU()), x)
    folded = tl.nn.fold_batch_norm(model)
    assert isinstance(folded[1], nn.Identity)
    assert folded[0].bias is not None
    with torch.no_grad():
        torch.testing.assert_close(folded(x).feats, model(x).feats, rtol=1e-5, atol=1e-5)


def test_what_is_not_folded_stays() -> None:
    x = _scene(3, seed=4)
    torch.manual_seed(5)
    model = nn.Sequential(
        tl.nn.NormalizedSubmConv3d(3, 6, 3),  # its weight is recomputed on every call
        tl.nn.BatchNorm(6),
        tl.nn.ReLU(),
        tl.nn.BatchNorm(6),  # follows no convolution
        tl.nn.SubmConv3d(6, 6, 3),
        tl.nn.BatchNorm(6, track_running_stats=False),  # batch statistics even in eval
    )
    model = _trained_stats(model, x)
    folded = tl.nn.fold_batch_norm(model)
    assert [type(m) for m in folded] == [type(m) for m in model]
    with torch.no_grad():
        torch.testing.assert_close(folded(x).feats, model(x).feats)


def test_training_mode_is_refused() -> None:
    model = nn.Sequential(tl.nn.SubmConv3d(3, 6, 3), tl.nn.BatchNorm(6))
    with pytest.raises(ValueError, match=r"fold_batch_norm: model is in training mode"):
        tl.nn.fold_batch_norm(model)


def test_half_precision_model_folds() -> None:
    x = _scene(3, seed=6)
    torch.manual_seed(7)
    model = _trained_stats(nn.Sequential(tl.nn.SubmConv3d(3, 8, 3), tl.nn.BatchNorm(8)), x)
    model = model.to(torch.bfloat16)
    xb = tl.SparseTensor(x.feats.to(torch.bfloat16), x.coords)
    folded = tl.nn.fold_batch_norm(model)
    assert folded[0].weight.dtype == torch.bfloat16 and folded[0].bias.dtype == torch.bfloat16
    with torch.no_grad():
        ref, got = model(xb).feats.float(), folded(xb).feats.float()
    torch.testing.assert_close(got, ref, rtol=0.05, atol=0.05 * float(ref.abs().max()))


def test_shared_convolutions_are_not_folded() -> None:
    """A convolution registered twice (``Sequential(conv, bn, relu, conv, bn)``) was folded
    twice, and one registered elsewhere in the model, or holding a weight another module
    holds, had its other use scaled: those stay unfolded, the others are folded, and the
    copy computes what the model computes."""
    x = _scene(2)
    conv, bn = tl.nn.SubmConv3d(2, 2, 3), tl.nn.BatchNorm(2)
    with torch.no_grad():
        bn.running_mean.fill_(3.0)
        bn.running_var.fill_(4.0)
    twice = nn.Sequential(conv, bn, tl.nn.ReLU(), conv, bn).eval()

    class Elsewhere(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = tl.nn.SubmConv3d(2, 2, 3)
            self.body = nn.Sequential(self.head, tl.nn.BatchNorm(2))
            self.tied = tl.nn.SubmConv3d(2, 2, 3)
            self.tail = nn.Sequential(tl.nn.SubmConv3d(2, 2, 3), tl.nn.BatchNorm(2))
            self.tail[0].weight = self.tied.weight
            self.last = nn.Sequential(tl.nn.SubmConv3d(2, 2, 3), tl.nn.BatchNorm(2))

        def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
            return self.last(self.tail(self.tied(self.body(self.head(x)))))

    elsewhere = _trained_stats(Elsewhere(), x).eval()
    for model, unfolded in ((twice, 2), (elsewhere, 2)):
        folded = tl.nn.fold_batch_norm(model)
        left = [m for _, m in folded.named_modules(remove_duplicate=False)
                if isinstance(m, tl.nn.BatchNorm)]
        assert len(left) == unfolded
        with torch.no_grad():
            torch.testing.assert_close(folded(x).feats, model(x).feats, rtol=1e-5, atol=1e-5)
    assert isinstance(tl.nn.fold_batch_norm(elsewhere).last[1], nn.Identity)  # not shared
