"""The Python examples of the README and the documentation pages run as written.

Every fenced ```` ```python ```` block of ``README.md`` and ``docs/**/*.md`` is
checked.  A page's blocks run in order in one namespace (later blocks use what
earlier ones built), in a temporary working directory, so an example that
writes ``out/model.lattice`` writes it there.  A top-level ``print(...)``
followed by a ``# comment`` must print that comment's text (``...`` in it
stands for any text), so documented outputs stay true.  An HTML comment on the line
just before a fence (invisible on GitHub and on the site) says how a block is
checked instead:

``<!-- example: signature -->``
    The block is a call signature, ``name(params)`` or ``y = name(params)``
    per statement: the parameters, their kinds (``*`` for keyword-only) and
    defaults must equal ``inspect.signature`` of the named function (required
    positional parameters may be named as the caller's variables: ``x`` for
    ``input``).
``<!-- example: not run (REASON) -->``
    The block needs what a test run does not have; REASON is one of
    :data:`NOT_RUN_REASONS`.  It must still compile.
``<!-- example: shell -->``
    Before a ```` ```bash ```` block: the block runs with ``bash -euo pipefail`` in a
    temporary directory, in the environment running the tests as if activated (its
    ``bin/`` first on ``PATH``, so ``python`` and console scripts such as
    ``convert-checkpoint`` are that environment's), and must succeed.  It may only use
    what works offline there; a line ``source .venv/bin/activate`` stands for that
    activation and is not run.

A page may also carry hidden set-up code, run in the page's namespace at its
position: an HTML comment whose first line is ``<!-- example-setup`` and which
ends with a line ``-->``; it provides the inputs an example takes as given
(``model``, ``points``, a legacy checkpoint file).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import io
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as F

ROOT = Path(__file__).resolve().parents[2]

#: Why a block may be left unrun; anything else fails the test.
NOT_RUN_REASONS = frozenset({"needs a GPU", "needs torchsparse", "needs torchrun"})

_MARK = re.compile(r"^<!-- example: (signature|shell|not run \((?P<why>[^)]*)\)) -->$")
_ACTIVATE = "source .venv/bin/activate"


@dataclass(frozen=True)
class Block:
    """One code unit of a page: an example, a signature, a not-run block or set-up."""

    kind: str  # "run", "signature", "not run", "setup", "shell"
    line: int  # 1-based line of the first code line
    code: str
    reason: str = ""


def page_blocks(path: Path) -> list[Block]:
    """The page's Python blocks and hidden set-up comments, in page order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == "<!-- example-setup":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "-->")
            code = textwrap.dedent("\n".join(lines[i + 1 : end]))
            blocks.append(Block("setup", i + 2, code))
            i = end + 1
            continue
        fence = re.match(r"^(\s*)(`{3,})(\S*)", line)
        if fence is None:
            i += 1
            continue
        indent, ticks, lang = fence.groups()
        end = i + 1
        while not lines[end].startswith(indent + ticks) or lines[end].strip() != ticks:
            end += 1
        mark = _MARK.match(lines[i - 1].strip()) if i > 0 else None
        code = "\n".join(ln[len(indent) :] for ln in lines[i + 1 : end])
        if lang == "python":
            kind, reason = "run", ""
            if mark is not None:
                assert mark.group(1) != "shell", f"{path}:{i}: a shell mark before python"
                kind = "signature" if mark.group(1) == "signature" else "not run"
                reason = mark.group("why") or ""
            blocks.append(Block(kind, i + 2, code, reason))
        elif mark is not None and mark.group(1) == "shell":
            assert lang == "bash", f"{path}:{i}: the shell mark stands before a bash block"
            blocks.append(Block("shell", i + 2, code))
        i = end + 1
    return blocks


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if "_build" not in p.parts and any(page_blocks(p))]


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _param_spec(params: str) -> list[tuple[str, str, object]]:
    """(name, kind, default) of a written parameter list; kind is inspect's name."""
    fn = ast.parse(f"def _({params}): pass").body[0]
    assert isinstance(fn, ast.FunctionDef)
    args = fn.args
    spec: list[tuple[str, str, object]] = []
    positional = args.args
    pos_defaults = [inspect.Parameter.empty] * (len(positional) - len(args.defaults))
    pos_defaults += [ast.literal_eval(d) for d in args.defaults]
    for arg, default in zip(positional, pos_defaults, strict=True):
        spec.append((arg.arg, "POSITIONAL_OR_KEYWORD", default))
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        default = inspect.Parameter.empty if kw_default is None else ast.literal_eval(kw_default)
        spec.append((arg.arg, "KEYWORD_ONLY", default))
    return spec


def _signature_calls(code: str) -> list[tuple[str, str]]:
    """(callee expression, parameter text) of each statement of a signature block."""
    calls: list[tuple[str, str]] = []
    statement = ""
    for raw in code.splitlines():
        text = raw.split("#", 1)[0].rstrip()
        statement = f"{statement} {text.strip()}" if statement else text.strip()
        if statement and statement.count("(") == statement.count(")"):
            match = re.fullmatch(r"(?:\w+\s*=\s*)?([\w.]+)\((.*)\)", statement)
            assert match is not None, f"not a call signature: {statement!r}"
            calls.append((match.group(1), match.group(2)))
            statement = ""
    assert not statement, f"unclosed signature: {statement!r}"
    return calls


def _check_signature(callee: str, params: str, where: str) -> None:
    func = eval(callee, {"tl": tl, "F": F, "torch": torch})  # a dotted name only
    actual = [(p.name, p.kind.name, p.default) for p in inspect.signature(func).parameters.values()]
    written = _param_spec(params)
    # Required positional parameters are written as the caller's variables
    # (``x`` for ``input``): their number, place and kind count, not their names.
    for spec in (written, actual):
        spec[:] = [
            ("<required>", kind, default)
            if kind == "POSITIONAL_OR_KEYWORD" and default is inspect.Parameter.empty
            else (name, kind, default)
            for name, kind, default in spec
        ]
    assert written == actual, f"{where}: {callee} is documented as {written}, but is {actual}"


@pytest.mark.parametrize("page", _pages(), ids=_id)
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace: dict[str, object] = {"__name__": "__doc_example__"}
    # A page may set the process-wide convolution configuration; the next must not see it.
    try:
        _run_page(page, namespace)
    finally:
        F.clear_global_conv_config()


def _run_page(page: Path, namespace: dict[str, object]) -> None:
    for block in page_blocks(page):
        where = f"{_id(page)}:{block.line}"
        if block.kind == "shell":
            _run_shell(block.code, where)
            continue
        compiled = compile(block.code, where, "exec") if block.kind != "signature" else None
        if block.kind == "signature":
            for callee, params in _signature_calls(block.code):
                _check_signature(callee, params, where)
        elif block.kind == "not run":
            assert block.reason in NOT_RUN_REASONS, f"{where}: unknown reason {block.reason!r}"
        else:
            assert compiled is not None
            _run_block(block.code, where, namespace)


def _run_shell(code: str, where: str) -> None:
    """Runs a shell block in the current (temporary) directory; see the module docstring."""
    script = [
        ": activated" if line.strip().startswith(_ACTIVATE) else line
        for line in code.splitlines()
    ]
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, (
        f"{where}: shell example failed (exit status {done.returncode}):\n"
        f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
    )


def _printed_comment(node: ast.stmt, lines: list[str]) -> str | None:
    """The ``# expected output`` after a top-level ``print(...)``, if any."""
    if not (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "print"
        and node.end_lineno is not None
        and node.end_col_offset is not None
    ):
        return None
    rest = lines[node.end_lineno - 1][node.end_col_offset :].strip()
    return rest[1:].strip() if rest.startswith("#") else None


def _run_block(code: str, where: str, namespace: dict[str, object]) -> None:
    """Run ``code`` statement by statement; a print's comment must match what it prints."""
    lines = code.splitlines()
    for node in ast.parse(code).body:
        compiled = compile(ast.Module([node], type_ignores=[]), where, "exec")
        expected = _printed_comment(node, lines)
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                exec(compiled, namespace)
        except Exception as exc:  # name the page and line
            raise AssertionError(f"{where}: example failed: {exc!r}") from exc
        if expected is not None:
            # "..." in the comment stands for any text.
            pattern = ".*".join(re.escape(part) for part in expected.split("..."))
            got = printed.getvalue().strip()
            assert re.fullmatch(pattern, got, re.S), (
                f"{where}: printed {got!r}, page says {expected!r}"
            )


def test_not_run_blocks_stay_few() -> None:
    held = [
        f"{_id(p)}:{b.line} ({b.reason})"
        for p in _pages()
        for b in page_blocks(p)
        if b.kind == "not run"
    ]
    ran = sum(b.kind == "run" for p in _pages() for b in page_blocks(p))
    assert ran >= 15 and len(held) <= 4, held


def test_markers_are_read(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- example-setup\nn = 2\n-->\n\n"
        "```python\nm = n + 1\n```\n\n"
        '<!-- example: signature -->\n```python\ny = tl.sparse_cat(inputs, join="inner")\n```\n'
        "<!-- example: not run (needs a GPU) -->\n```python\nx.cuda()\n```\n"
        "```bash\nls\n```\n"
        "<!-- example: shell -->\n```bash\nsource .venv/bin/activate\npython -c 'pass'\n```\n"
    )
    blocks = page_blocks(page)
    assert [(b.kind, b.line, b.reason) for b in blocks] == [
        ("setup", 2, ""),
        ("run", 6, ""),
        ("signature", 11, ""),
        ("not run", 15, "needs a GPU"),
        ("shell", 22, ""),
    ]
    _check_signature("tl.sparse_cat", 'inputs, join="inner"', "probe")
    with pytest.raises(AssertionError, match="documented as"):
        _check_signature("tl.sparse_cat", 'inputs, join="outer"', "probe")
    with pytest.raises(AssertionError, match="documented as"):
        _check_signature("tl.voxelize", "points, features, batch_indices=None", "probe")


def test_print_comments_are_checked() -> None:
    namespace: dict[str, object] = {}
    _run_block(
        "x = [1, 2]\nprint(x)  # [1, 2]\nprint(x, 'a b')  # [1, ...] a b\n", "probe", namespace
    )
    with pytest.raises(AssertionError, match="page says '3'"):
        _run_block("print(1 + 1)  # 3\n", "probe", namespace)
    with pytest.raises(AssertionError, match="probe: example failed"):
        _run_block("1 / 0\n", "probe", namespace)


def _prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks and HTML comments."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    in_comment = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = line.strip()
        if fence is not None:
            fence = None if stripped == fence else fence
        elif in_comment:
            in_comment = "-->" not in stripped
        elif re.match(r"`{3,}", stripped):
            fence = re.match(r"`{3,}", stripped).group(0)  # type: ignore[union-attr]
        elif stripped.startswith("<!--"):
            in_comment = "-->" not in stripped
        else:
            out.append((number, line))
    return out


def test_no_prose_line_starts_a_block_quote() -> None:
    """A wrapped sentence whose next line starts with ">" (">= 2.4") renders as a block
    quote; the pages use none on purpose, so every such line is a wrapping accident."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    quoted = [
        f"{_id(p)}:{n}: {line}"
        for p in pages
        if "_build" not in p.parts
        for n, line in _prose_lines(p)
        if line.lstrip().startswith(">")
    ]
    assert not quoted, quoted


def test_prose_lines_skip_code_and_comments(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("a\n```bash\n> not prose\n```\n<!-- x\n> hidden\n-->\n>= 2.4 here\n")
    assert _prose_lines(page) == [(1, "a"), (8, ">= 2.4 here")]


def test_shell_blocks_run_in_the_test_environment(tmp_path: Path) -> None:
    """The test's own interpreter comes first on PATH (``source .venv/bin/activate`` is
    not run), and a failing command fails the example, naming the page and line."""
    _run_shell(
        "source .venv/bin/activate   # the scripts' environment\n"
        f'test "$(command -v python)" = "{Path(sys.executable).parent}/python"\n',
        "probe",
    )
    with pytest.raises(AssertionError, match=r"probe: shell example failed \(exit status 3\)"):
        _run_shell("true\nexit 3\necho never\n", "probe")


def test_setup_docs_name_the_commands_the_set_up_prints() -> None:
    """The README's two set-up paths quote the restore and accept commands exactly as
    scripts/setup-env.sh prints them when something replaced the venv's torch."""
    spec = importlib.util.spec_from_file_location(
        "setup_env_record", ROOT / "scripts" / "setup_env_record.py"
    )
    assert spec is not None and spec.loader is not None
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"`{record.restore_command('.venv')}`" in readme
    assert "`TORCH_LATTICE_ACCEPT_TORCH=1 scripts/setup-env.sh`" in readme
    shells = [b for b in page_blocks(ROOT / "README.md") if b.kind == "shell"]
    assert any(_ACTIVATE in b.code and "convert-checkpoint --help" in b.code for b in shells)
