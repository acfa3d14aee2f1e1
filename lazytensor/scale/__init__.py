"""Reductions beyond one full product: block-sparse ``ranges`` (:mod:`.ranges`, their
clustering helpers in :mod:`.cluster`), one reduction over blocks of its reduced axis
(:mod:`.blocks`) and the array-level merge of partial results (:mod:`.merge`), on which
:mod:`lazytensor.distributed` and :mod:`lazytensor.dask` build.
"""
