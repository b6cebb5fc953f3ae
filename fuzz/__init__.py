"""streamfuzz: property-based fuzzing of cross-stream tensor lifetimes.

Data flows strategies -> scenario -> driver -> ranks -> target -> oracles ->
verdict -> corpus; each step is one module of this package.
"""

__version__ = "0.1.0"
