from qvi.cli import main

main()
