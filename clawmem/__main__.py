from clawmem.cli import main

main()
