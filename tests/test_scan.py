"""``fuzz scan``: each hazard class found in a buggy form and not in its safe twin,
suppression, exit codes, determinism, the inputs (tree, wheel, sdist, installed
package) and the harness it writes.

The fixtures are small sources written here; nothing is fetched. The rules
about code shapes have their hazard and safe forms in ``test_scan_rules.py``;
the scans of real engine releases, which run only where the release is
already on disk and skip, saying so, elsewhere, are ``test_scan_recall.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from streamfuzz.fuzz.scan import scan
from streamfuzz.fuzz.scan.hazards import Hazard
from streamfuzz.fuzz.scan.sources import ScanInputError, open_source
from tests.helpers import ROOT
from tests.helpers import fuzz_cli as _cli

# Each hazard class: (buggy source, safe source, the class, the buggy function).
CASES: dict[str, tuple[str, str, Hazard, str]] = {
    "lifetime-param-on-side": ('''
        import torch

        class Bcast:
            def __init__(self):
                self.side = torch.cuda.Stream()

            def send(self, table, idx_mapping):
                self.side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.side):
                    rows = table[idx_mapping]
                    rows.add_(1)
                    self.out = rows
        ''', '''
        import torch

        class Bcast:
            def __init__(self):
                self.side = torch.cuda.Stream()

            def send(self, table, idx_mapping):
                self.side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.side):
                    rows = table[idx_mapping]
                    rows.add_(1)
                    idx_mapping.record_stream(self.side)
                    table.record_stream(self.side)
                    self.out = rows
        ''', Hazard.LIFETIME, "Bcast.send"),
    "lifetime-made-on-side": ('''
        import torch

        def sample(logits, copy_stream):
            with torch.cuda.stream(copy_stream):
                q = torch.empty_like(logits).exponential_()
            torch.cuda.current_stream().wait_stream(copy_stream)
            return logits.div_(q).argmax(dim=-1)
        ''', '''
        import torch

        def sample(logits, copy_stream):
            with torch.cuda.stream(copy_stream):
                q = torch.empty_like(logits).exponential_()
            torch.cuda.current_stream().wait_stream(copy_stream)
            q.record_stream(torch.cuda.current_stream())
            return logits.div_(q).argmax(dim=-1)
        ''', Hazard.LIFETIME, "sample"),
    "unordered-side-reads-current": ('''
        import torch

        class Store:
            def __init__(self):
                self.store_stream = torch.cuda.Stream()

            def save(self, kv: torch.Tensor, host: torch.Tensor):
                with torch.cuda.stream(self.store_stream):
                    host.copy_(kv, non_blocking=True)
        ''', '''
        import torch

        class Store:
            def __init__(self):
                self.store_stream = torch.cuda.Stream()

            def save(self, kv: torch.Tensor, host: torch.Tensor):
                self.store_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.store_stream):
                    host.copy_(kv, non_blocking=True)
        ''', Hazard.UNORDERED, "Store.save"),
    "pinned-rewrite": ('''
        import torch

        class Offsets:
            def __init__(self, n):
                self.host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
                self.dev = torch.zeros(n, dtype=torch.int32, device="cuda")

            def upload(self, values):
                self.host[: len(values)] = torch.as_tensor(values)
                self.dev.copy_(self.host, non_blocking=True)
        ''', '''
        import torch

        class Offsets:
            def __init__(self, n):
                self.host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
                self.dev = torch.zeros(n, dtype=torch.int32, device="cuda")
                self.done = torch.cuda.Event()

            def upload(self, values):
                self.done.synchronize()
                self.host[: len(values)] = torch.as_tensor(values)
                self.dev.copy_(self.host, non_blocking=True)
                self.done.record()
        ''', Hazard.PINNED_REWRITE, "Offsets.upload"),
    "unsynced-d2h": ('''
        import torch

        def sampled_ids(tokens):
            host = tokens.to("cpu", non_blocking=True)
            return host.tolist()
        ''', '''
        import torch

        def sampled_ids(tokens):
            host = tokens.to("cpu", non_blocking=True)
            torch.cuda.current_stream().synchronize()
            return host.tolist()
        ''', Hazard.UNSYNCED_D2H, "sampled_ids"),
    "event-before-work": ('''
        import torch

        def handoff(x, side):
            done = torch.cuda.Event()
            done.record()
            y = x.mul_(2)
            side.wait_event(done)
            with torch.cuda.stream(side):
                z = y.sum()
            return z
        ''', '''
        import torch

        def handoff(x, side):
            done = torch.cuda.Event()
            y = x.mul_(2)
            done.record()
            side.wait_event(done)
            with torch.cuda.stream(side):
                z = y.sum()
            return z
        ''', Hazard.EARLY_EVENT, "handoff"),
    "module-level-stream": ('''
        import functools
        import torch

        @functools.lru_cache
        def _copy_stream():
            return torch.cuda.Stream()
        ''', '''
        import torch

        class Copier:
            def __init__(self):
                self.copy_stream = torch.cuda.Stream()
        ''', Hazard.CACHED_STREAM, "_copy_stream"),
    "unwaited-collective": ('''
        import torch
        import torch.distributed as dist

        def reduce_and_scale(grad):
            work = dist.all_reduce(grad, async_op=True)
            grad.mul_(0.5)
            work.wait()
        ''', '''
        import torch
        import torch.distributed as dist

        def reduce_and_scale(grad):
            work = dist.all_reduce(grad, async_op=True)
            work.wait()
            grad.mul_(0.5)
        ''', Hazard.ASYNC_COLLECTIVE, "reduce_and_scale"),
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _scan(path: Path) -> list:
    return scan(open_source(str(path))).findings


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_class_found_in_buggy_form_only(tmp_path, case):
    buggy, safe, hazard, function = CASES[case]
    bad = [f for f in _scan(_write(tmp_path, "buggy.py", buggy)) if f.hazard is hazard]
    assert bad, f"{case}: no {hazard.value} finding in the buggy form"
    assert any(f.function == function for f in bad)
    good = [f for f in _scan(_write(tmp_path, "safe.py", safe)) if f.hazard is hazard]
    assert not good, f"{case}: the safe form was reported: {[f.what for f in good]}"


def test_finding_names_tensors_streams_and_what_makes_it_safe(tmp_path):
    f = next(f for f in _scan(_write(tmp_path, "m.py", CASES["lifetime-param-on-side"][0]))
             if f.hazard is Hazard.LIFETIME)
    assert f.tensors == ("idx_mapping",)
    assert "self.side" in f.streams and "current stream" in f.streams
    assert "record_stream" in f.safe_if
    assert f.site == "m.py:11"


def test_thread_target_is_judged_against_its_submitter(tmp_path):
    src = '''
        import threading
        import torch

        class Offload:
            def __init__(self):
                self.stream = torch.cuda.Stream()
                self.kv = torch.zeros(8, device="cuda")
                threading.Thread(target=self._loop, daemon=True).start()

            def _loop(self):
                while True:
                    with torch.cuda.stream(self.stream):
                        self.out = self.kv.to("cpu", non_blocking=True)
        '''
    found = [f for f in _scan(_write(tmp_path, "t.py", src)) if f.function == "Offload._loop"]
    assert any(f.hazard is Hazard.UNORDERED and "thread" in f.factors for f in found)


def test_optional_wait_left_out_by_one_caller(tmp_path):
    src = '''
        import torch

        class Backend:
            def launch(self, src, dst, wait_event=None):
                if wait_event is not None:
                    self.stream.wait_event(wait_event)
                with torch.cuda.stream(self.stream):
                    dst.copy_(src, non_blocking=True)

        class Worker:
            def load(self):
                self.backend.launch(self.cpu, self.gpu)

            def store(self):
                self.done.record(torch.cuda.current_stream())
                self.backend.launch(self.gpu, self.cpu, wait_event=self.done)
        '''
    found = [f for f in _scan(_write(tmp_path, "w.py", src)) if f.function == "Worker.load"]
    assert [f.line for f in found] == [13]
    assert "sibling-passes" in found[0].factors


def test_suppression_drops_the_site_and_keeps_it_in_json(tmp_path):
    buggy = textwrap.dedent(CASES["unsynced-d2h"][0]).replace(
        "return host.tolist()", "return host.tolist()  # streamfuzz: safe caller synced")
    path = tmp_path / "s.py"
    path.write_text(buggy)
    result = scan(open_source(str(path)))
    assert not result.active
    assert [f.suppressed for f in result.findings] == ["caller synced"]
    out = tmp_path / "r.json"
    assert _cli("scan", str(path), "--json", str(out)).returncode == 0
    data = json.loads(out.read_text())
    assert data["findings"] == [] and data["suppressed"][0]["suppressed"] == "caller synced"


def test_exit_status_follows_the_threshold(tmp_path):
    path = _write(tmp_path, "b.py", CASES["unsynced-d2h"][0])
    score = scan(open_source(str(path))).active[0].score
    assert _cli("scan", str(path)).returncode == 0
    assert _cli("scan", str(path), "--fail-above", str(score)).returncode == 1
    assert _cli("scan", str(path), "--fail-above", str(score + 1)).returncode == 0
    clean = _write(tmp_path, "c.py", CASES["unsynced-d2h"][1])
    assert _cli("scan", str(clean), "--fail-above", "1").returncode == 0


@pytest.mark.parametrize("args, says", [
    (["scan", "no/such/dir"], "no such file or directory"),
    (["scan", "no_such_package_xyz"], "no installed package"),
    (["scan", "BAD.whl"], "not a readable wheel"),
    (["scan", "BAD.tar.gz"], "not a readable sdist"),
    (["scan", "X", "--fail-above", "abc"], "not an integer"),
    (["scan", "X", "--harness", "nowhere"], "expected FILE:LINE"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    (tmp_path / "BAD.whl").write_bytes(b"not a zip")
    (tmp_path / "BAD.tar.gz").write_bytes(b"not a tar")
    (tmp_path / "X").mkdir()
    args = [str(tmp_path / a) if a in ("BAD.whl", "BAD.tar.gz", "X") else a for a in args]
    out = tmp_path / "r.json"
    r = _cli(*args, "--json", str(out))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], r.stderr
    assert not out.exists()


def _tree(tmp_path: Path) -> Path:
    pkg = tmp_path / "src" / "enginepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for i, case in enumerate(sorted(CASES)):
        (pkg / f"m{i}.py").write_text(textwrap.dedent(CASES[case][0]))
    return pkg


def test_tree_wheel_sdist_and_installed_give_the_same_findings(tmp_path, monkeypatch):
    pkg = _tree(tmp_path)
    whl = tmp_path / "enginepkg-1.2.3-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for p in sorted(pkg.iterdir()):
            zf.write(p, f"enginepkg/{p.name}")
        zf.writestr("enginepkg-1.2.3.dist-info/METADATA", "Name: enginepkg\nVersion: 1.2.3\n")
    sdist = tmp_path / "enginepkg-1.2.3.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        for p in sorted(pkg.iterdir()):
            tf.add(p, f"enginepkg-1.2.3/src/enginepkg/{p.name}")
    monkeypatch.syspath_prepend(str(pkg.parent))

    def sig(spec: str) -> list:
        return [(f.hazard, f.file, f.line, f.score) for f in scan(open_source(spec)).findings]

    from_tree = sig(str(pkg))
    assert len(from_tree) >= len(CASES)
    assert all(file.startswith("enginepkg/") for _, file, _, _ in from_tree)
    assert sig(str(whl)) == from_tree
    assert sig(str(sdist)) == from_tree
    assert sig("enginepkg") == from_tree
    assert open_source(str(whl)).version == "1.2.3"


def test_output_is_deterministic_across_processes(tmp_path):
    pkg = _tree(tmp_path)
    outs = []
    for i, seed in enumerate(("0", "12345")):
        js, md = tmp_path / f"r{i}.json", tmp_path / f"r{i}.md"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        r = subprocess.run([sys.executable, "-m", "streamfuzz", "scan", str(pkg), "--json", str(js),
                            "--md", str(md), "--top", "0"], capture_output=True, text=True,
                           cwd=ROOT, timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        data = json.loads(js.read_text())
        data.pop("seconds")
        outs.append((data, md.read_text(), r.stdout))
    assert outs[0] == outs[1]
    ranks = [f["rank"] for f in outs[0][0]["findings"]]
    scores = [f["score"] for f in outs[0][0]["findings"]]
    assert ranks == list(range(1, len(ranks) + 1)) and scores == sorted(scores, reverse=True)


def test_test_code_scores_lower(tmp_path):
    src = CASES["unsynced-d2h"][0]
    (tmp_path / "tests").mkdir()
    _write(tmp_path, "tests/test_x.py", src)
    _write(tmp_path, "engine.py", src)
    found = {f.file: f.score for f in scan(open_source(str(tmp_path))).active}
    assert found["tests/test_x.py"] < found["engine.py"]


def test_unparsable_file_is_listed_not_fatal(tmp_path):
    _write(tmp_path, "ok.py", CASES["unsynced-d2h"][0])
    (tmp_path / "broken.py").write_text("def f(:\n    torch.cuda.stream(s)\n")
    result = scan(open_source(str(tmp_path)))
    assert result.unparsed == ["broken.py"] and result.active


def test_missing_path_refused_before_reading():
    with pytest.raises(ScanInputError):
        open_source("definitely/not/here")


_SEND = '''
import torch
from no_such_engine.utils import log_once  # not importable here: stood in


class Bcast:
    def __init__(self):
        self.side = torch.cuda.Stream()

    @log_once
    def send(self, table, idx_mapping):
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            rows = table[idx_mapping]
            rows.add_(1)
        return rows
'''
_SEND_FIXED = _SEND.replace("            rows.add_(1)\n", "            rows.add_(1)\n"
                            "            idx_mapping.record_stream(self.side)\n"
                            "            table.record_stream(self.side)\n")


def _harness(tmp_path: Path, text: str, name: str) -> subprocess.CompletedProcess:
    src = tmp_path / name
    src.mkdir()
    (src / "engine.py").write_text(text)
    out = tmp_path / f"test_{name}.py"
    r = _cli("scan", str(src), "--harness", "engine.py:14", "--out", str(out))
    assert r.returncode == 0, r.stderr
    body = out.read_text()
    assert "@given(" in body and "streamfuzz.checked()" in body
    assert "idx_mapping.record_stream" not in body
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(out), "--streamfuzz-device", "cpu"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_harness_runs_and_finds_the_bug_its_fixed_twin_is_clean(tmp_path):
    bad = _harness(tmp_path, _SEND, "buggy")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "StreamfuzzError" in bad.stdout and "lifetime:" in bad.stdout
    assert "record_stream(side" in bad.stdout
    good = _harness(tmp_path, _SEND_FIXED, "fixed")
    assert good.returncode == 0, good.stdout + good.stderr


def test_harness_stands_in_for_unimportable_imports(tmp_path):
    from streamfuzz.standins import load

    src = tmp_path / "pkg"
    src.mkdir()
    (src / "engine.py").write_text(_SEND)
    loaded = load(str(src), "engine.py")
    assert "no_such_engine.utils" in loaded.stood_in
    assert callable(loaded.module.Bcast.send)  # the stood-in decorator kept the function


def test_harness_refuses_a_line_outside_any_function(tmp_path):
    (tmp_path / "engine.py").write_text(_SEND)
    r = _cli("scan", str(tmp_path), "--harness", "engine.py:2")
    assert r.returncode == 2 and "no function there" in r.stderr


def test_an_optional_wait_whose_absence_still_orders_is_not_flagged(tmp_path):
    src = '''
        import torch

        class Backend:
            def launch(self, src, dst, wait_event=None):
                if wait_event is None:
                    self.stream.wait_stream(torch.cuda.current_stream())
                else:
                    self.stream.wait_event(wait_event)
                with torch.cuda.stream(self.stream):
                    dst.copy_(src, non_blocking=True)
                self.done.record(self.stream)

        class Worker:
            def load(self):
                self.backend.launch(self.cpu, self.gpu)

            def store(self):
                self.ready.record()
                self.backend.launch(self.gpu, self.cpu, wait_event=self.ready)
        '''
    found = _scan(_write(tmp_path, "w.py", src))
    assert not [f.what for f in found if f.hazard is Hazard.UNORDERED]
    assert {f.hazard for f in found} == {Hazard.LIFETIME}  # src, dst: no record_stream


def test_a_helper_named_like_a_stream_context_enters_its_stream(tmp_path):
    src = '''
        import torch

        def to_host(frames, stream, out):
            with _torch_stream_context(stream):
                out.copy_(frames, non_blocking=True)
                stream.synchronize()
            return out.numpy()
        '''
    found = _scan(_write(tmp_path, "d.py", src))
    assert not [f for f in found if f.hazard is Hazard.UNSYNCED_D2H]
    assert [f.streams for f in found if f.hazard is Hazard.UNORDERED] == [
        ("current stream", "stream")]


def test_event_annotations_and_query_gates_order(tmp_path):
    src = '''
        import torch

        def start_shared(shared, x, fork: torch.cuda.Event, stream):
            fork.record(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fork.wait(stream)
                out = shared(x)
            return out

        class Health:
            def poll(self, bufs):
                for b, buf in bufs.items():
                    if self.ev.query():
                        flags = self.host.tolist()
                    self.host.copy_(buf.health, non_blocking=True)
                    self.ev.record()
        '''
    found = _scan(_write(tmp_path, "h.py", src))
    assert not [f for f in found if f.hazard in (Hazard.UNORDERED, Hazard.UNSYNCED_D2H)]
    gate_removed = textwrap.dedent(src).replace("if self.ev.query():", "if True:")
    assert [f.function for f in _scan(_write(tmp_path, "h2.py", gate_removed))
            if f.hazard is Hazard.UNSYNCED_D2H] == ["Health.poll"]


def test_a_containers_items_are_references_not_tensor_writes(tmp_path):
    src = '''
        import torch

        def project(x, fns, aux):
            start = torch.cuda.Event()
            start.record()
            results: list[torch.Tensor | None] = [None, None]
            for i, fn in enumerate(fns):
                if aux is None:
                    results[i] = fn(x)
                    continue
                with torch.cuda.stream(aux):
                    start.wait()
                    results[i] = fn(x)
            return results
        '''
    assert not [f.what for f in _scan(_write(tmp_path, "p.py", src))]
    as_tensor = textwrap.dedent(src).replace(
        "results: list[torch.Tensor | None] = [None, None]", "results = torch.empty(2)")
    assert {f.hazard for f in _scan(_write(tmp_path, "t.py", as_tensor))} >= {
        Hazard.UNORDERED}


def test_a_collectives_work_wait_orders_the_waiting_stream(tmp_path):
    src = '''
        import torch

        def exchange(inputs, cp_stream, group):
            outs, reqs = [None] * len(inputs), [None] * len(inputs)
            for i in range(len(inputs)):
                outs[i] = torch.empty_like(inputs[i])
                reqs[i] = torch.distributed.all_to_all_single(
                    outs[i], inputs[i], group=group, async_op=True)
                with torch.cuda.stream(cp_stream):
                    reqs[i].wait()
                    outs[i] = outs[i] * 2
            return outs
        '''
    assert not [f.what for f in _scan(_write(tmp_path, "e.py", src))]
    unwaited = textwrap.dedent(src).replace("reqs[i].wait()", "pass")
    assert {f.hazard for f in _scan(_write(tmp_path, "u.py", unwaited))} == {
        Hazard.UNORDERED, Hazard.ASYNC_COLLECTIVE}


_DEFAULT_EVENT = '''
    import torch

    class Engine:
        def submit(self, transfers, start_event=None):
            with self._submission(transfers, self.stream, start_event):
                pass

        def load(self, transfers):
            self.submit(transfers)

        def store(self, transfers):
            self.submit(transfers, start_event=self.ev)

        def _submission(self, transfers, stream, start_event=None):
            start_event = self._start_event(start_event)
            with torch.cuda.stream(stream):
                start_event.wait(stream)
                yield transfers

        @staticmethod
        def _start_event(start_event):
            if start_event is None:
                start_event = torch.cuda.Event()
                start_event.record()
            return start_event
    '''


def test_a_default_event_recorded_by_a_helper_orders_the_omitting_call(tmp_path):
    assert not [f.what for f in _scan(_write(tmp_path, "d.py", _DEFAULT_EVENT))]
    unrecorded = textwrap.dedent(_DEFAULT_EVENT).replace("start_event.record()", "pass")
    found = _scan(_write(tmp_path, "n.py", unrecorded))
    assert [(f.function, f.factors) for f in found] == [("Engine.load", ("sibling-passes",))]


def test_a_method_resolves_through_its_receivers_stated_class(tmp_path):
    src = '''
        import torch

        class Overlap:
            def fork(self) -> None:
                self._fork_event.record()
                self.stream.wait_event(self._fork_event)

        class Prefetch:
            def fork(self, point, layer):
                return point

        def gates(x, *, overlap: Overlap):
            stream = overlap.stream
            overlap.fork()
            with torch.cuda.stream(stream):
                y = x * 2
            x.record_stream(stream)
            torch.cuda.current_stream().wait_stream(stream)
            return y
        '''
    def unordered(name: str, text: str) -> list[str]:
        return [f.what for f in _scan(_write(tmp_path, name, text))
                if f.hazard is Hazard.UNORDERED]

    assert not unordered("g.py", src)
    untyped = textwrap.dedent(src).replace("*, overlap: Overlap", "overlap")
    assert unordered("u.py", untyped) == [
        "overlap.stream reads x, last written on current stream, with no wait between them"]


def test_a_side_stream_that_waits_at_each_entry_lowers_a_lifetime_finding(tmp_path):
    src = '''
        import torch

        def branch(q, side_stream, merge):
            main_stream = torch.cuda.current_stream()
            side_stream.wait_stream(main_stream)
            with torch.cuda.stream(side_stream):
                recv = q.new_empty(4)
                recv.copy_(q)
            main_stream.wait_stream(side_stream)
            return merge(recv)
        '''
    barred = [f for f in _scan(_write(tmp_path, "b.py", src)) if f.hazard is Hazard.LIFETIME]
    assert [f.factors for f in barred] == [("dies-here", "entry-barrier")]
    open_entry = textwrap.dedent(src).replace("side_stream.wait_stream(main_stream)", "pass")
    plain = [f for f in _scan(_write(tmp_path, "o.py", open_entry))
             if f.hazard is Hazard.LIFETIME]
    assert [f.factors for f in plain] == [("dies-here",)]
    assert plain[0].score > barred[0].score


def test_a_parameter_every_caller_passes_as_host_memory_is_not_a_stream_tensor(tmp_path):
    src = '''
        import torch

        def _upload(src, device):
            cur = torch.cuda.current_stream(device)
            staging = _staging(device)
            with torch.cuda.stream(staging):
                tmp = src.to(device, non_blocking=True)
            cur.wait_stream(staging)
            tmp.record_stream(cur)
            return tmp

        def to(self, device):
            if self.is_cpu and device.type == "cuda":
                return _upload(self, device)
            return self

        def copy(dst, src):
            if dst.is_cuda and src.device.type == "cpu":
                dst.copy_(_upload(src, dst.device))
        '''
    assert not [f.what for f in _scan(_write(tmp_path, "h.py", src))
                if f.function == "_upload"]
    # One caller that may pass a device tensor: the side stream reads the caller's
    # tensor with no wait for the stream that wrote it.
    device_caller = textwrap.dedent(src) + textwrap.dedent('''
        def refresh(x):
            return _upload(x * 2, x.device)
        ''')
    found = [f for f in _scan(_write(tmp_path, "d.py", device_caller))
             if f.function == "_upload"]
    assert [f.hazard for f in found] == [Hazard.UNORDERED]
    assert found[0].tensors == ("src",)


def test_a_reference_in_a_local_list_outlives_the_call_only_with_the_list(tmp_path):
    src = '''
        import torch

        def stash(tensors, d2h):
            d2h.wait_stream(torch.cuda.current_stream())
            held: list = []
            with torch.cuda.stream(d2h):
                for t in tensors:
                    buf = torch.empty(t.shape, device="cpu", pin_memory=True)
                    buf.copy_(t, non_blocking=True)
                    held.append((t, buf))
            return None
        '''
    found = [f for f in _scan(_write(tmp_path, "s.py", src)) if f.hazard is Hazard.LIFETIME]
    assert [f.factors for f in found] == [("caller-owned",)]
    returned = textwrap.dedent(src).replace("return None", "return held")
    found = [f for f in _scan(_write(tmp_path, "r.py", returned)) if f.hazard is Hazard.LIFETIME]
    assert [f.factors for f in found] == [("kept",)]


_STAGED_UPLOAD = '''
    import torch

    class Batch:
        def __init__(self, device):
            self.device = device
            self.staged_tokens = None
            self.tokens = None

    def upload_inputs(batch: Batch) -> None:
        if batch.staged_tokens is not None:
            batch.tokens = batch.staged_tokens.to(batch.device, non_blocking=True)
            batch.staged_tokens = None

    class Runner:
        def __init__(self):
            self.fwd = torch.cuda.Stream()

        def step(self, batch: Batch):
            self.fwd.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.fwd):
                upload_inputs(batch)
                return batch.tokens.sum()
    '''


def test_a_tensor_a_side_stream_only_copies_to_the_device_may_be_dropped(tmp_path):
    def dropped(name: str, text: str) -> list[tuple[str, ...]]:
        return [f.tensors for f in _scan(_write(tmp_path, name, text))
                if f.hazard is Hazard.LIFETIME and f.function == "Runner.step"
                and "freed" in f.factors]

    # The copy's source is host memory held by the host allocator until the copy
    # ran (or a tensor already on the device, where nothing is queued); the
    # `is not None` test reads no storage.
    assert dropped("up.py", _STAGED_UPLOAD) == []
    # The same tensor read by a kernel, or converted to another dtype, on the side stream.
    kernel = textwrap.dedent(_STAGED_UPLOAD).replace(
        ".to(batch.device, non_blocking=True)", ".cumsum(0)")
    assert dropped("k.py", kernel) == [("batch.staged_tokens",)]
    convert = textwrap.dedent(_STAGED_UPLOAD).replace("batch.device,", "torch.float16,")
    assert dropped("c.py", convert) == [("batch.staged_tokens",)]


_HANDOFF = '''
    import torch

    class Loader:
        def __init__(self):
            self.side = torch.cuda.Stream()

        def load(self, rows, out):
            with torch.cuda.stream(self.side):
                out.copy_(rows)
                done = torch.cuda.Event()
                done.record()
            return out, done
    '''


def test_a_tensor_handed_back_with_an_event_recorded_after_its_writes_scores_lower(tmp_path):
    def unordered(name: str, text: str) -> dict[tuple[str, ...], object]:
        return {f.tensors: f for f in _scan(_write(tmp_path, name, text))
                if f.hazard is Hazard.UNORDERED}

    handed = unordered("h.py", _HANDOFF)
    out, rows = handed[("out",)], handed[("rows",)]
    assert "event-handoff" in out.factors
    assert "the caller waits on done" in out.safe_if
    # The read of the caller's rows is not covered by the event: a finding apart, as before.
    assert "event-handoff" not in rows.factors and rows.score > out.score
    # The event recorded before the writes covers none of them: that stays a hazard.
    copy, record = "                out.copy_(rows)\n", "                done.record()\n"
    early_text = _HANDOFF.replace(copy, "").replace(record, record + copy)
    early = _scan(_write(tmp_path, "e.py", early_text))
    assert [f.tensors for f in early if f.hazard is Hazard.EARLY_EVENT] == [("out",)]
    write = next(f for f in early if f.hazard is Hazard.UNORDERED and "out" in f.tensors)
    assert "event-handoff" not in write.factors and write.score > out.score


def test_a_fresh_tensor_a_side_stream_writes_unordered_is_no_handoff(tmp_path):
    # Made on the current stream here and written by the side stream with no wait:
    # the block's last owner may still be in use on the current stream, and no
    # wait of the caller's after the event orders the write's start.
    fresh = _HANDOFF.replace("def load(self, rows, out):\n",
                             "def load(self, rows):\n            out = torch.empty_like(rows)\n")
    found = {f.tensors: f for f in _scan(_write(tmp_path, "f.py", fresh))
             if f.hazard is Hazard.UNORDERED}
    out = next(f for t, f in found.items() if "out" in t)
    assert "event-handoff" not in out.factors and "write" in out.factors
    passed_in = {f.tensors: f for f in _scan(_write(tmp_path, "p.py", _HANDOFF))
                 if f.hazard is Hazard.UNORDERED}[("out",)]
    assert out.score > passed_in.score
