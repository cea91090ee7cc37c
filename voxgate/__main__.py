from voxgate.cli import main

raise SystemExit(main())
