"""The package version, in a leaf module: the CLI and the case study's metadata read it without importing the
package's public names (``genprobe/__init__.py`` sits at the top layer)."""

__version__ = "0.2.0"
