from rl360cli.cli import main

main()
