print("hammer")
