"""The packaged suite: run it against the SGLang installed here with

    pytest --pyargs pytest_eagle3.suite --tp 2

Each test starts (or reuses) a real SGLang engine on the target checkpoint and
compares what it captures with the transformers reference.
"""
