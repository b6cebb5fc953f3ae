"""A target named by the path of its file: ``path/to/file.py:attr``."""

import pytest

from streamfuzz.fuzz import corpus, driver, targets
from streamfuzz.fuzz.options import Oracle, RunOptions
from tests.helpers import one_step

_HANDLER = '''
from sibling_{tag} import base


def make(ctx):
    return base(ctx)
'''
_SIBLING = '''
from tests.cuda_handlers import PlainMainGather, PlainPreFix


def base(ctx):
    return {cls}(ctx)
'''


def _write(tmp_path, tag, cls):
    (tmp_path / f"sibling_{tag}.py").write_text(_SIBLING.format(cls=cls))
    path = tmp_path / f"handler_{tag}.py"
    path.write_text(_HANDLER.format(tag=tag))
    return path



def test_a_file_target_runs_on_the_ranks_with_its_sibling_imports(cpu_pool, tmp_path):
    options = RunOptions(oracles={Oracle.LIFETIME, Oracle.VALUE})
    bad = driver.evaluate(cpu_pool, f"{_write(tmp_path, 'bad', 'PlainPreFix')}:make",
                          one_step(), options)
    assert not bad.ok and bad.first.kind == "lifetime", bad.summary()
    good = driver.evaluate(cpu_pool, f"{_write(tmp_path, 'good', 'PlainMainGather')}:make",
                           one_step(), options)
    assert good.ok, good.summary()


def test_a_file_in_a_package_is_imported_as_part_of_it_and_its_relative_imports_work(
        cpu_pool, tmp_path):
    pkg = tmp_path / "engine_pkg_t" / "pp"
    pkg.mkdir(parents=True)
    for d in (pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "base.py").write_text(_SIBLING.format(cls="PlainPreFix"))
    (pkg / "handler.py").write_text("from .base import base\n\n\n"
                                    "def make(ctx):\n    return base(ctx)\n")
    target = f"{pkg / 'handler.py'}:make"
    assert targets.import_name(target, str(pkg / "handler.py")) == "engine_pkg_t.pp.handler"
    bad = driver.evaluate(cpu_pool, target, one_step(),
                          RunOptions(oracles={Oracle.LIFETIME, Oracle.VALUE}))
    assert not bad.ok and bad.first.kind == "lifetime", bad.summary()


@pytest.mark.parametrize(("file", "says"), [
    ("missing.py", "no such file"),
    ("my-handler.py", "rename it to a valid Python module name"),
    ("json.py", "a module named 'json' is already imported"),
])
def test_a_file_target_that_cannot_load_says_why_in_one_line(tmp_path, file, says):
    if file != "missing.py":
        (tmp_path / file).write_text("def make(ctx):\n    return None\n")
    with pytest.raises(targets.TargetError) as err:
        targets.load(f"{tmp_path / file}:make")
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_file_target_names_no_hidden_corpus_folder():
    assert corpus.target_dir("./handler.py:make") == "handler.py-make"
    assert corpus.target_dir("pkg.mod:attr") == "pkg.mod-attr"


def test_a_handler_without_its_protocols_methods_says_which_protocol_it_looks_like(cpu_pool):
    # Bad usage, not a finding: the driver raises it instead of judging the example.
    with pytest.raises(targets.TargetError) as err:
        driver.evaluate(cpu_pool, "tests.targets:weight_sync_shaped", one_step())
    says = str(err.value)
    assert says.startswith("target 'tests.targets:weight_sync_shaped': the handler "
                           "WeightSyncShaped has no ") and "\n" not in says, says
    assert ("which the draft-broadcast protocol calls on the last rank" in says
            or "which the draft-broadcast protocol calls on the other ranks" in says), says
    assert "it has the weight-sync protocol's methods: declare protocol = 'weight-sync'" in says
    # The ranks go on: the next example of another target runs.
    assert driver.evaluate(cpu_pool, "main-gather", one_step()).ok


def test_a_target_named_by_the_modules_old_names_still_loads(cpu_pool):
    """Corpus entries and scripts written before the package owned one import name
    give ``fuzz.x:attr``; nothing else answers to ``fuzz``, so it is ``streamfuzz.fuzz.x``."""
    from streamfuzz.fuzz.draft.targets.pp_draft import MainGather

    assert targets.load("fuzz.draft.targets.pp_draft:MainGather") is MainGather
    # The ranks load it by the same name.
    assert driver.evaluate(cpu_pool, "fuzz.draft.targets.pp_draft:MainGather", one_step()).ok
    with pytest.raises(targets.TargetError, match="no attribute"):
        targets.load("fuzz.draft.targets.pp_draft:Nothing")
    with pytest.raises(targets.TargetError, match="cannot import"):
        targets.load("fuzz.no_such_module:make")
