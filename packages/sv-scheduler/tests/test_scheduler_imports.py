"""sv-kvcache and sv-scheduler are pure Python: they import with torch blocked."""

from __future__ import annotations

import subprocess
import sys

BLOCK_TORCH = """
import sys
class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
        return None
sys.meta_path.insert(0, BlockTorch())
import sv_kvcache, sv_scheduler
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch was imported"
sched = sv_scheduler.Scheduler(sv_scheduler.SchedulerConfig(num_pages=4, max_model_len=64))
sched.add(sv_scheduler.Request("r", [1, 2, 3], 2))
plan = sched.schedule()
sched.complete_step(plan, [5])
print("ok")
"""


def test_import_without_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_no_torch_in_dependencies() -> None:
    from importlib.metadata import requires

    assert not requires("sv-kvcache")
    assert [r for r in requires("sv-scheduler") or []] == ["sv-kvcache"]
