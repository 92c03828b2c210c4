"""Shipped model artefacts (installed as :mod:`qkm.models`; see ``README.md`` here).

``fashion_mnist_qkmeans.qkm`` is the demo model ``qkm serve`` serves when given
no model file (:func:`qkm.serve.demo_model_path`). It ships in the wheel, so
``pip install qkm`` then ``qkm serve`` works with nothing else;
``build_demo_model.py`` rebuilds it (``make models``).
"""
