"""The example notebooks: each executes top to bottom (nbclient, kernel "python3") on the CPU
backend, is committed with its outputs stripped, and matches examples/_make_notebooks.py.

The kernel finds the package through ``CUPY_FLASHATTN_ROOT`` (read by each notebook's first
cell) and runs in examples/, as Jupyter would.  ``CUPY_FLASHATTN_DEMO_CPU=1`` forces the NumPy
/ Numba backend; the ``gpu``-marked variant runs the same notebooks on CuPy.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("[0-9][0-9]_*.ipynb"))
EXPECTED = [
    "01_quickstart.ipynb",
    "02_paged_kv_inference.ipynb",
    "03_page_block_size_story.ipynb",
    "04_interop_dlpack.ipynb",
    "05_performance.ipynb",
]
CELL_TIMEOUT_S = 300
# Text a notebook prints when a result misses flash-attn's bound (or a check is False).
BAD_MARKERS = ("ABOVE BOUND", "within flash-attn's bound: False", "fixes agree: False")


def _load_generator():
    path = EXAMPLES / "_make_notebooks.py"
    spec = importlib.util.spec_from_file_location("_make_notebooks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _execute(path: Path, monkeypatch, force_cpu: bool) -> str:
    """Run the notebook in a fresh kernel; return all its stream/text output."""
    monkeypatch.setenv("CUPY_FLASHATTN_ROOT", str(REPO))
    if force_cpu:
        monkeypatch.setenv("CUPY_FLASHATTN_DEMO_CPU", "1")
    else:
        monkeypatch.delenv("CUPY_FLASHATTN_DEMO_CPU", raising=False)
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiet debugger warning
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": str(EXAMPLES)}},
    )
    client.execute()  # raises CellExecutionError (with the traceback) if a cell fails
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":  # pragma: no cover - execute() raised already
                pytest.fail(f"{path.name}: {out.get('ename')}: {out.get('evalue')}")
            if out.get("output_type") == "stream":
                texts.append(out.get("text", ""))
            elif "data" in out:
                texts.append(out["data"].get("text/plain", ""))
    return "".join(texts)


def test_all_notebooks_present():
    assert [p.name for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_cpu(path, monkeypatch):
    text = _execute(path, monkeypatch, force_cpu=True)
    for marker in BAD_MARKERS:
        assert marker not in text, f"{path.name} printed {marker!r}:\n{text}"
    if path.name != "05_performance.ipynb":  # 05 reads CSV files only
        assert "CPU backend" in text, text


@pytest.mark.gpu
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_gpu(path, monkeypatch):
    text = _execute(path, monkeypatch, force_cpu=False)
    for marker in BAD_MARKERS:
        assert marker not in text, f"{path.name} printed {marker!r}:\n{text}"
    if path.name != "05_performance.ipynb":
        assert "(GPU)" in text, text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name}: outputs not stripped; regenerate with "
                "python examples/_make_notebooks.py")
    assert path.stat().st_size < 64 * 1024, f"{path.name} is not small"


def test_notebooks_match_generator():
    gen = _load_generator()
    assert sorted(gen.NOTEBOOKS) == EXPECTED
    for name in EXPECTED:
        assert (EXAMPLES / name).read_text() == gen.render(name), (
            f"{name} differs from examples/_make_notebooks.py; edit the generator and rerun it")


def test_first_cell_finds_the_package_from_examples_dir(tmp_path, monkeypatch):
    """Without CUPY_FLASHATTN_ROOT the setup cell looks in the parent of the working
    directory (Jupyter's cwd is the notebook's folder)."""
    gen = _load_generator()
    assert 'os.path.dirname(os.getcwd())' in gen.SETUP
    assert 'os.environ.get("CUPY_FLASHATTN_ROOT")' in gen.SETUP
    assert os.path.isdir(REPO / "cupy_flashattn")


def test_performance_notebook_plots_bench_csv(tmp_path, monkeypatch):
    """05 on a CSV in benchmarks/bench.py's layout (ours + peer columns per row) and a
    long-format decode CSV: one panel per configuration, a ratio table."""
    (tmp_path / "bench.csv").write_text(
        "dtype,d,seqlen,batch,heads,causal,mode,ms,tflops,flash_tflops,ratio_flash,"
        "cudnn_tflops,ratio_cudnn\n"
        "bf16,128,2048,8,16,0,dense,1.0,243,329,0.74,631,0.39\n"
        "bf16,128,2048,8,16,0,paged16,1.0,137,329,0.42,631,0.22\n"
        "bf16,128,8192,2,16,0,dense,1.0,253,356,0.71,677,0.37\n"
        "bf16,128,8192,2,16,1,dense,1.0,244,309,0.79,589,0.42\n"
    )
    (tmp_path / "decode.csv").write_text(
        "kind,provider,dtype,d,seqlen_k,gbps\n"
        "decode,cupy_flashattn,bf16,128,1024,1500\ndecode,torch flash,bf16,128,1024,1800\n"
    )
    monkeypatch.setenv("CUPY_FLASHATTN_RESULTS", str(tmp_path))
    text = _execute(EXAMPLES / "05_performance.ipynb", monkeypatch, force_cpu=True)
    assert "3 panel(s)" in text, text
    assert "prefill (TFLOP/s): bf16 D=128 non-causal" in text
    assert "torch SDPA cudnn" in text and "cupy_flashattn paged16" in text
    assert "decode (GB/s): bf16 D=128" in text and "torch flash" in text
    assert "ratio_flash" in text
