"""Sandbox images on the nodes: the image list, registry digests, the pin map and the wave puller.

`rl360 prewarm-images` (rl360cli/stages/prewarm_images.py) puts these together; see docs/images.md.
"""
