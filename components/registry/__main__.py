from components.registry.cli import main

raise SystemExit(main())
