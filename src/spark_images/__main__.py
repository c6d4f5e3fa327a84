"""`python -m spark_images` runs the CLI."""

from spark_images.cli import main

raise SystemExit(main())
