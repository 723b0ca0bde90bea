"""What SGLang captured: the request side of the data path.

* :mod:`.cases`: the id-list cases of the packaged suite (contract fixtures);
* :mod:`.declare`: :class:`~.declare.EngineNeed`, the one declaration of the
  engine a packaged test needs, read by the fixtures and by ``--eagle3-plan``;
* :mod:`.api`: reading aux hidden states through SGLang's HTTP API.

Nothing here imports torch or sglang at import time.
"""
