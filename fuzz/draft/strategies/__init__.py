"""Hypothesis strategies of draft-broadcast scenarios (re-exported by ``strategies``)."""
