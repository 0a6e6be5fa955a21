from components.launch.cli import main

raise SystemExit(main())
