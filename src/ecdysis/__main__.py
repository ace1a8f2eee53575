from ecdysis.cli.main import main

main()
