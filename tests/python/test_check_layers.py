"""scripts/check_layers.py's rules read from the tree: the directions between the server's parts (an include
up or sideways fails, as does a folder in no part) and no import cycle among the Python modules. Each on a
small fixture tree that breaks it, and on this tree, which keeps it."""
import importlib.util
import os

from qvi_testing import REPO

spec = importlib.util.spec_from_file_location("check_layers", os.path.join(REPO, "scripts", "check_layers.py"))
check_layers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_layers)


def write(root, path, text):
    f = root / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)


def test_an_include_up_or_sideways_between_parts_fails_and_one_down_passes(tmp_path):
    write(tmp_path, "server/core/base/sync.h", '#include "server/core/runner/model_runner.h"\n')
    write(tmp_path, "server/auth/api_keys.cc", '#include "server/auth/api_keys.h"\n#include "server/tls/tls.h"\n')
    write(tmp_path, "server/frontend/call.cc", '#include "server/core/runner/model_runner.h"\n'
                                               '#include "server/logging.h"\n')
    write(tmp_path, "server/main.cc", '#include "server/http/http_server.h"\n')
    write(tmp_path, "server/rooms/new.cc", '#include "server/core/base/sync.h"\n')
    problems = check_layers.direction_problems(tmp_path)
    assert problems == [
        "server/auth/api_keys.cc (part auth, level 9) includes server/tls/tls.h (part tls, level 9): an include "
        "sideways; a part includes only parts on lower levels (PARTS)",
        "server/core/base/sync.h (part base, level 0) includes server/core/runner/model_runner.h (part runner, "
        "level 6): an include up; a part includes only parts on lower levels (PARTS)",
        "server/rooms/new.cc: in no part of scripts/check_layers.py's PARTS (add its folder to one)",
    ], problems


def test_this_trees_includes_go_down_the_levels():
    assert check_layers.direction_problems(check_layers.ROOT) == []


def test_an_import_cycle_fails_even_when_it_is_put_off_into_a_function(tmp_path):
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/a.py", "from pkg import b\n")
    write(tmp_path, "pkg/b.py", "def later():\n    from . import c\n")
    write(tmp_path, "pkg/c.py", "import pkg.a\n")
    write(tmp_path, "pkg/d.py", "from .a import something\n")  # into the circle, not part of it
    write(tmp_path, "tools/one.py", "import two\n")
    write(tmp_path, "tools/two.py", "import os\n")
    problems = check_layers.import_cycle_problems(tmp_path, (("pkg", "pkg"), ("tools", "")))
    assert problems == ["pkg: the modules pkg.a, pkg.b, pkg.c import each other in a circle"], problems


def test_this_trees_python_modules_import_in_no_circle():
    assert check_layers.import_cycle_problems(check_layers.ROOT) == []
