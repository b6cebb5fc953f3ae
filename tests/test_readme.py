"""The README's example target is the file the suite fuzzes, and it is clean."""


from streamfuzz.fuzz import driver
from tests.helpers import ROOT


def test_readme_shows_the_example_target_verbatim():
    code = (ROOT / "examples" / "my_handler.py").read_text()
    assert code.strip() in (ROOT / "README.md").read_text()


def test_example_target_is_clean(cpu_pool, ci_settings):
    res = driver.fuzz(cpu_pool, "examples.my_handler:make_handler", ci_settings,
                      max_examples=40, seed=0)
    assert res.failure is None, res.failure
