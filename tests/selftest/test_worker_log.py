"""selftest names the exception a dying vLLM worker logged, not vLLM's wrapper around it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from patcher.agent.selftest.worker_log import Captured, worker_exception

pytestmark = pytest.mark.fast

# vLLM 0.16's CPU worker, VLLM_CPU_OMP_THREADS_BIND=99 (the header repeated on every line).
LOGGED_016 = """\
[2026-12-01 14:06:06] INFO logging_utils.py:49:   Initializing executor...
libnuma: Warning: cpu argument 99 is out of range
ERROR 12-01 14:06:12 [multiproc_executor.py:783] WorkerProc failed to start.
ERROR 12-01 14:06:12 [multiproc_executor.py:783] Traceback (most recent call last):
ERROR 12-01 14:06:12 [multiproc_executor.py:783]   File "/env/vllm/v1/executor/multiproc_executor.py", line 754, in worker_main
ERROR 12-01 14:06:12 [multiproc_executor.py:783]     worker = WorkerProc(*args, **kwargs)
ERROR 12-01 14:06:12 [multiproc_executor.py:783]   File "/env/vllm/v1/worker/cpu_worker.py", line 87, in init_device
ERROR 12-01 14:06:12 [multiproc_executor.py:783]     ret = torch.ops._C_utils.init_cpu_threads_env(self.local_omp_cpuid)
ERROR 12-01 14:06:12 [multiproc_executor.py:783]   File "/env/torch/_ops.py", line 1209, in __call__
ERROR 12-01 14:06:12 [multiproc_executor.py:783]     return self._op(*args, **kwargs)
ERROR 12-01 14:06:12 [multiproc_executor.py:783] RuntimeError: Failed to parse CPU string: 99
INFO 12-01 14:06:13 [multiproc_executor.py:700] shutting down
"""

# A prefixed worker (vllm.utils.system_utils._add_prefix), coloured, a chained exception, and
# the parent's own traceback after it.
LOGGED_CHAINED = """\
\x1b[36m(Worker pid=4242)\x1b[0m ERROR 12-01 10:00:00 [multiproc_executor.py:898] WorkerProc failed to start.
\x1b[36m(Worker pid=4242)\x1b[0m ERROR 12-01 10:00:00 [multiproc_executor.py:898] Traceback (most recent call last):
\x1b[36m(Worker pid=4242)\x1b[0m ERROR 12-01 10:00:00 [multiproc_executor.py:898]   File "/env/vllm/attention/selector.py", line 40, in _import
\x1b[36m(Worker pid=4242)\x1b[0m ERROR 12-01 10:00:00 [multiproc_executor.py:898]     import flashinfer
\x1b[36m(Worker pid=4242)\x1b[0m ERROR 12-01 10:00:00 [multiproc_executor.py:898] ModuleNotFoundError: No module named 'flashinfer'
\x1b[36m(Worker pid=4242)\x1b[0m ERROR 12-01 10:00:00 [multiproc_executor.py:898]
\x1b[36m(Worker pid=4242)\x1b[0m ERROR 12-01 10:00:00 [multiproc_executor.py:898] The above exception was the direct cause of the following exception:
\x1b[36m(Worker pid=4242)\x1b[0m ERROR 12-01 10:00:00 [multiproc_executor.py:898]
\x1b[36m(Worker pid=4242)\x1b[0m ERROR 12-01 10:00:00 [multiproc_executor.py:898] Traceback (most recent call last):
\x1b[36m(Worker pid=4242)\x1b[0m ERROR 12-01 10:00:00 [multiproc_executor.py:898]   File "/env/vllm/v1/worker/gpu_worker.py", line 300, in init_device
\x1b[36m(Worker pid=4242)\x1b[0m ERROR 12-01 10:00:00 [multiproc_executor.py:898] RuntimeError: attention backend unavailable
\x1b[36m(Worker pid=4242)\x1b[0m ERROR 12-01 10:00:00 [multiproc_executor.py:898] (two lines of message)
Traceback (most recent call last):
  File "/env/speculators/data_generation/vllm_hidden_states_generator.py", line 128, in __init__
Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
"""


def test_the_cpu_workers_own_error_with_its_innermost_frames():
    found = worker_exception(LOGGED_016)
    assert (found["type"], found["message"]) == ("RuntimeError", "Failed to parse CPU string: 99")
    assert found["frames"] == [
        "/env/vllm/v1/executor/multiproc_executor.py:754 in worker_main",
        "/env/vllm/v1/worker/cpu_worker.py:87 in init_device",
        "/env/torch/_ops.py:1209 in __call__",
    ]
    assert "raised" not in found


def test_a_prefixed_worker_comes_before_the_parent_and_its_root_cause_first():
    found = worker_exception(LOGGED_CHAINED)
    assert found["process"] == "Worker pid=4242"
    assert (found["type"], found["message"]) == ("ModuleNotFoundError", "No module named 'flashinfer'")
    assert found["raised"] == "RuntimeError: attention backend unavailable\n(two lines of message)"


def test_nothing_logged_is_none():
    assert worker_exception("INFO 12-01 10:00:00 [x.py:1] all fine\n") is None


def test_captured_output_reaches_the_file_from_child_processes(tmp_path):
    """A worker is a child process: what it writes on fds 1 and 2 lands in the log."""
    log = tmp_path / "vllm.log"
    with Captured(str(log)) as captured:
        subprocess.run(
            [sys.executable, "-c", "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"], check=True
        )
        captured.original_stderr.write("progress\n")
        os.write(1, b"parent\n")
    assert captured.text().splitlines() == ["to stdout", "to stderr", "parent"]
