"""Writing small lattice artifacts inside tests (no tests here).

Graph text follows the lattice-contract builder's form, written out by hand so the
replay tests do not depend on the exporter under test.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from torch_lattice.artifact import schema

SP = "!lattice.sparse_tensor<rank = 3, coord = batch_x_y_z, feature = row_channel, dtype = f32>"


def weight_type(family: str) -> str:
    return f"!lattice.weight<{family}, f32>"


def weight_line(sym: str, key: str, family: str, packing: str = "#lattice.packing<dense>"
                ) -> str:
    layout = schema.WEIGHT_FAMILY_LAYOUTS[family]
    return (f"%{sym} = lattice.weight @{sym} {{storage_key = \"{key}\", layout = "
            f"#lattice.weight_layout<{layout}>, packing = {packing}}} : {weight_type(family)}")


def triple(name: str, value: tuple[int, int, int]) -> str:
    return f"{name} = array<i64: {value[0]}, {value[1]}, {value[2]}>"


class Graph:
    """Accumulates arguments and body lines; :meth:`text` renders the module."""

    def __init__(self) -> None:
        self.args: list[tuple[str, str, str]] = []  # (name, type, role)
        self.body: list[str] = []
        self.outputs: list[tuple[str, str, str, str]] = []  # (value, type, name, role)
        self.ir_version = schema.IR_VERSION
        self.digest = schema.SCHEMA_DIGEST

    def sparse_input(self, name: str, channels: int, stride: tuple[int, int, int] = (1, 1, 1),
                     dtype: str = "f32") -> str:
        ft = f"tensor<?x{channels}x{dtype}>"
        self.args += [(f"{name}_coords", "tensor<?x4xi32>", "sparse_coords"),
                      (f"{name}_features", ft, "sparse_features"),
                      (f"{name}_active", "tensor<1xi32>", "sparse_active")]
        sp = SP.replace("dtype = f32", f"dtype = {dtype}")
        self.body.append(
            f"%{name} = lattice.sparse.make %{name}_coords, %{name}_features, %{name}_active "
            f"{{{triple('stride', stride)}, coord_order = #lattice.coord<batch_x_y_z>}} : "
            f"(tensor<?x4xi32>, {ft}, tensor<1xi32>) -> {sp}"
        )
        return name

    def tensor_input(self, name: str, type_text: str) -> str:
        self.args.append((name, type_text, "tensor"))
        return name

    def weight(self, sym: str, key: str, family: str, packing: str = "#lattice.packing<dense>"
               ) -> str:
        self.body.append(weight_line(sym, key, family, packing))
        return sym

    def op(self, result: str, name: str, operands: list[str], types: list[str], attrs: str,
           result_type: str) -> str:
        attr_text = f" {{{attrs}}}" if attrs else ""
        refs = ", ".join("%" + o for o in operands)
        self.body.append(f"%{result} = lattice.{name} {refs}{attr_text} : "
                         f"({', '.join(types)}) -> {result_type}")
        return result

    def output(self, value: str, type_text: str, name: str = "output") -> None:
        role = "sparse_tensor" if type_text.startswith("!lattice.sparse_tensor") else "tensor"
        self.outputs.append((value, type_text, name, role))

    def text(self) -> str:
        def strings(items: list[str]) -> str:
            return "[" + ", ".join(f'"{s}"' for s in items) + "]"

        types = [t for _, t, _, _ in self.outputs]
        result = types[0] if len(types) == 1 else f"({', '.join(types)})"
        args = ",\n    ".join(f"%{n}: {t}" for n, t, _ in self.args)
        body = "\n".join("    " + line for line in self.body)
        rets = ", ".join("%" + v for v, _, _, _ in self.outputs)
        return (
            "module attributes {\n"
            f"  lattice.ir_version = {self.ir_version},\n"
            f'  lattice.schema_digest = "{self.digest}",\n'
            f"  lattice.input_names = {strings([n for n, _, _ in self.args])},\n"
            f"  lattice.input_roles = {strings([r for _, _, r in self.args])},\n"
            f"  lattice.output_names = {strings([n for _, _, n, _ in self.outputs])},\n"
            f"  lattice.output_roles = {strings([r for _, _, _, r in self.outputs])},\n"
            f'  lattice.weight_file = "{schema.WEIGHT_FILE}"\n'
            "} {\n"
            f"  func.func @forward(\n    {args}\n  ) -> {result} {{\n{body}\n"
            f"    return {rets} : {', '.join(types)}\n  }}\n}}\n"
        )


def write_artifact(root: Path, graph: str | Graph, weights: dict[str, torch.Tensor]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    text = graph.text() if isinstance(graph, Graph) else graph
    (root / schema.GRAPH_FILE).write_text(text, encoding="utf-8")
    save_file({k: v.contiguous() for k, v in weights.items()}, str(root / schema.WEIGHT_FILE),
              metadata={"format": "torch"})
    return root


def sparse_inputs(name: str, coords: torch.Tensor, feats: torch.Tensor, active: int | None = None
                  ) -> dict[str, torch.Tensor]:
    n = coords.shape[0] if active is None else active
    return {f"{name}_coords": coords.to(torch.int32), f"{name}_features": feats,
            f"{name}_active": torch.tensor([n], dtype=torch.int32)}


def artifact_weight(canonical: torch.Tensor, kernel_size: tuple[int, int, int]) -> torch.Tensor:
    """``(K, C_in, C_out)`` canonical rows -> stored ``conv3d_o_xyz_i`` (API.md's formula)."""
    _, cin, cout = canonical.shape
    return canonical.reshape(*kernel_size, cin, cout).permute(4, 0, 1, 2, 3).contiguous()


def random_coords(n: int, extent: int, batches: int = 2, seed: int = 0) -> torch.Tensor:
    """``n`` unique sorted int32 rows in ``[0, batches) x [0, extent)^3``."""
    g = torch.Generator().manual_seed(seed)
    cells = torch.randperm(batches * extent**3, generator=g)[:n].sort().values
    b, rest = cells // extent**3, cells % extent**3
    x, rest = rest // extent**2, rest % extent**2
    y, z = rest // extent, rest % extent
    return torch.stack([b, x, y, z], dim=1).to(torch.int32)
