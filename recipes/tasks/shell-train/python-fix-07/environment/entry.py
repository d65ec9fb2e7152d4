print("stone")
