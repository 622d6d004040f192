from kubeddp.tools.cli.main import main

raise SystemExit(main())
