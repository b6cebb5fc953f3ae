"""``python -m streamfuzz``: the command line, with a crash of the tool itself (even
one while importing it, such as a missing package) kept apart from findings."""

import sys
import traceback

from streamfuzz.fuzz.errors import EXIT_CRASH


def main() -> int:
    try:
        from streamfuzz.fuzz import zygote
        from streamfuzz.fuzz.worlds import at_start

        if at_start(sys.argv[1:]) == 1:  # a controller of several worlds forks no rank
            zygote.prestart(sys.argv[1:])  # CPU ranks' torch import, beside ours
        from streamfuzz.fuzz.cli import main as cli_main
    except KeyboardInterrupt:  # Ctrl-C while importing: as after, not a traceback
        print("streamfuzz: interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print(f"streamfuzz: crashed while starting (exit {EXIT_CRASH}); nothing was fuzzed",
              file=sys.stderr)
        return EXIT_CRASH
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
