"""Helpers the chapters and the tests share to prove exactness (:mod:`.exactness`)."""
