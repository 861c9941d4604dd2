from patcher.cli import console

console()
