"""scripts/setup.sh says where it is: when a step fails it names the stage, the log and its last lines
(here the C++ build, with a ninja that fails); what it ran goes to .stamps/setup.log."""
import os
import stat
import subprocess

from qvi_testing import REPO


def test_a_failing_step_names_its_stage_and_shows_the_logs_tail(tmp_path):
    fake = tmp_path / "ninja"
    fake.write_text("#!/bin/sh\necho 'ninja: error: the build broke here' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}"))
    assert out.returncode != 0, out.stdout + out.stderr
    log = os.path.join(REPO, ".stamps", "setup.log")
    assert f"failed in stage \"checking what is up to date\"" in out.stderr or "failed in stage \"building C++" \
        in out.stderr, out.stderr
    assert f"the log: {log}; its last lines:" in out.stderr, out.stderr
    assert "ninja: error: the build broke here" in out.stderr.split("its last lines:")[1], out.stderr
    assert out.stdout.splitlines()[0].endswith(f"set-up; the detail goes to {log}"), out.stdout
