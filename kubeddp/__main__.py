from kubeddp.tools.cli import main

raise SystemExit(main())
