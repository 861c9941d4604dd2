from patcher.cli import main

main()
