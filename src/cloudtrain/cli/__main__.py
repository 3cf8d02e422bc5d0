from cloudtrain.cli.app import main

main()
