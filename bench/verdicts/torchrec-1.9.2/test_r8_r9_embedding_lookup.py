"""torchrec 1.9.2, ranks 8 and 9: ``train_pipeline/utils.py``'s embedding lookup start.

Driven as ``TrainPipelineSemiSync.start_embedding_lookup`` calls it: under the
embedding-lookup stream, ``source_stream`` the data-dist stream (where the
input dist's ``wait()`` makes the KJT), ``target_stream`` the training stream,
``stream_context`` ``torch.cuda.stream``; the module's lookup reads the KJT on
the lookup stream.

* Rank 8, ``_start_embedding_lookup_legacy`` (l.321): flagged, the lookup stream
  reads the KJT unordered with the data-dist stream's write (its docstring says
  so: it is kept for the ``killswitch_emb_lookup_stream_sync`` fallback).
  Its fixed twin is upstream's own: rank 9's function, clean on the same run.
* Rank 9, ``_start_embedding_lookup_stream_synced`` (l.377): clean. The lookup
  stream waits on an event recorded on the source stream after the KJT is
  made, and ``record_stream`` is called for every consumer stream in a loop
  over a set the scan does not expand.

Hand edits: the module, its context and the input dist's awaitable are small
objects with the attributes the functions read; the KJT is a tensor.
"""

import torch

from bench.verdicts import _kit

REL = "torchrec-1.9.2"
FILE = "torchrec/distributed/train_pipeline/utils.py"


class _Awaitable:
    def __init__(self, make):
        self._make = make

    def wait(self):
        return self._make()


def _start(fn_name):
    module = _kit.release(REL, FILE).module
    data_dist, lookup = torch.cuda.Stream(), torch.cuda.Stream()
    main = torch.cuda.current_stream()
    features = torch.zeros(32, device="cuda")
    features.add_(1.0)  # the batch, copied and written on the training stream
    data_dist.wait_stream(main)  # the input dist starts after it (its own wait)
    features.record_stream(data_dist)  # the pipeline keeps its batch until the input dist is done
    seen = []
    ctx = _kit.Obj(record_stream=lambda s: None)
    sharded = _kit.Obj(forward=_kit.Obj(name="ebc"),
                       compute_and_output_dist=lambda mctx, kjt: seen.append(kjt * 2))
    context = _kit.Obj(module_contexts={"ebc": ctx}, embedding_a2a_requests={},
                       input_dist_tensors_requests={"ebc": _Awaitable(lambda: features + 1)})
    with torch.cuda.stream(lookup):
        getattr(module, fn_name)(sharded, context, source_stream=data_dist,
                                 target_stream=main, stream_context=torch.cuda.stream)
    main.wait_stream(lookup)
    return seen



def test_rank8_legacy_flagged():
    found = _kit.findings(_start, "_start_embedding_lookup_legacy")
    assert any("read-after-write" in f and "aten.add" in f for f in found), found
    assert any("freed while stream lookup may still use it" in f for f in found), found


def test_rank9_stream_synced_clean():
    assert _kit.findings(_start, "_start_embedding_lookup_stream_synced") == []
