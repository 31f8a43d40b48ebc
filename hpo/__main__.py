from hpo.cli import main

raise SystemExit(main())
