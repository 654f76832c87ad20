"""The offline demo: ES on the embedded arithmetic model (`model/`, pretrained by `pretrain.py`), held-out Pass@k
before and after."""
