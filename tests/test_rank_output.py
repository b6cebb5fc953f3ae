"""What a crash finding says: the cause, not pages of C++ backtrace."""

from streamfuzz.fuzz.crash_text import cause

_ABORT = """\
/src/aten/native/cuda/IndexKernel.cu:111: operator(): block: [0,0,0], thread: [0,0,0] \
Assertion `index < sizes[i] && "index out of bounds"` failed.
/src/aten/native/cuda/IndexKernel.cu:111: operator(): block: [0,0,0], thread: [1,0,0] \
Assertion `index < sizes[i] && "index out of bounds"` failed.
terminate called after throwing an instance of 'c10::AcceleratorError'
  what():  CUDA error: device-side assert triggered
Exception raised from c10_cuda_check_implementation at /src/c10/cuda/CUDAException.cpp:44:
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f00 in /lib/libc10.so)
frame #1: <unknown function> + 0x1234 (0x7f01 in /lib/libc10_cuda.so)
"""


def test_a_device_assert_keeps_the_assert_once_and_drops_frames_and_paths():
    text = cause(_ABORT)
    assert text.startswith("IndexKernel.cu:111: operator()")
    assert text.count("Assertion") == 1
    assert "device-side assert triggered" in text
    assert "frame #" not in text and "/src/" not in text and "/lib/" not in text


def test_without_a_cause_line_the_last_lines_are_kept():
    assert cause("starting\nstep 1\nstep 2\n") == "starting | step 1 | step 2"
    assert cause("") == "(no output)"
    assert len(cause("x" * 5000, limit=100)) == 100
