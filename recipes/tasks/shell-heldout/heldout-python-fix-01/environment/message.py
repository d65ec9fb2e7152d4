print("pencil")
