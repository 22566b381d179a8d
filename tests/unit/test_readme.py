"""The README's Python example runs as written and trains."""
import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python example"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), {})
    losses = [float(line.split()[1]) for line in out.getvalue().splitlines()]
    assert len(losses) == 5 and losses[-1] < losses[0]
