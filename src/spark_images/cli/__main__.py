"""`python -m spark_images.cli` runs the CLI."""

from spark_images.cli import main

raise SystemExit(main())
