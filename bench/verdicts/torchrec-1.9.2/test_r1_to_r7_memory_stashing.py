"""torchrec 1.9.2, ranks 1-7: ``MemoryStashingManager`` (``memory_stashing.py``).

* Ranks 1-2 (``stash_embedding_weights`` calls ``_stash_tensors`` without
  ``sync_event=``) and 3-6 (``restore_embedding_weights()`` /
  ``restore_optimizer_state()`` without it): without the event, ``execute_stash``
  and ``restore`` (closures of ``_stash_tensors``) make their stream wait for
  the current stream (``else: ...wait_stream(torch.cuda.current_stream())``);
  only the ``*_threaded`` variants, whose work runs on a pool thread, pass an
  event recorded on the submitter's stream.
* Rank 7 (``restore``'s ``tmp``, a tensor made on the current stream, used by
  the H2D stream, rebound with no ``record_stream``): ``tmp`` is a view set on
  ``hbm_ref``'s storage (``tmp.set_(hbm_ref.untyped_storage(), ...)``), and
  ``hbm_ref.record_stream(h2d_stream)`` follows each copy: the storage is
  recorded; ``tmp``'s own block is empty.

Driven as the stashing pipelines do on the training thread: the forward
writes the weights, ``stash_embedding_weights``'s non-delayed path
(``_stash_tensors(tensors, label="embedding")``, the restore callback
registered), then ``restore_embedding_weights()``, ``await_restore`` and the
next forward's read. Clean. With the ``else`` branch of ``execute_stash``'s
wait removed (what a missing wait would be), the same run is flagged (the D2H
stream reads the table unordered with the forward's write): the harness sees
the ordering ranks 1-2 rest on. Removing ``restore``'s ``else`` is not flagged
on CPU: what it would expose is the reallocated block's previous owner, and the
simulation does not model a storage ``resize_`` as an allocation; ranks 3-6
rest on the reading and the clean run.

Hand edits: none to the package; the harness calls ``_stash_tensors`` and
registers the callback as ``stash_embedding_weights`` does (its collection of
a module's tensors needs sharded modules).
"""

import torch

from bench.verdicts import _kit

REL = "torchrec-1.9.2"
FILE = "torchrec/distributed/memory_stashing.py"
STASH_ELSE = ("            else:\n"
              "                d2h_stream.wait_stream(torch.cuda.current_stream())\n")


def _cycle(module):
    m = module.MemoryStashingManager
    m.set_streams(torch.cuda.Stream(), torch.cuda.Stream())
    tables = [torch.zeros(64, 8, device="cuda") for _ in range(2)]  # two: restore rebinds tmp
    for weights in tables:
        weights.add_(1.0)  # the forward (and optimizer) write the tables on the current stream
    await_restore, restore, _ = m._stash_tensors(tables, label="embedding")
    m._embedding_weight_restore_callbacks.append(restore)  # as stash_embedding_weights does
    m.restore_embedding_weights()
    await_restore()
    return [weights.sum() for weights in tables]  # the next forward reads the restored tables



def test_release_clean_without_the_event():
    assert _kit.findings(_cycle, _kit.release(REL, FILE).module) == []


def test_without_execute_stashs_else_wait_flagged():
    twin = _kit.twin(REL, FILE, STASH_ELSE, "")
    found = _kit.findings(_cycle, twin.module)
    assert any("read-after-write" in f and "aten.add_" in f for f in found), found
