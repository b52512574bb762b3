"""ResNet image classification on MindSpore: ``env`` (set before MindSpore loads), ``utils``,
``data``, ``models``, ``training``, ``deploy``. Imports go one way (docs/layout.md); importing a
module has no side effect but ``src.env``'s and ``src.startup``'s.
"""
